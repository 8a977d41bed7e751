package identity

import "os"

// stamp identifies one version of a file without reading it: identity
// (device and inode, via os.SameFile), size, modification time and, where the
// platform exposes it, change time. A file replaced by rename always has a
// new inode while the old one is still linked, so one replacement between two
// looks is always seen, even when size and mtime are equal: Linux file times
// come from a coarse clock that may tick only every few milliseconds. Change
// time, which user space cannot set, additionally catches in-place rewrites
// that restore the old mtime (cp -p, touch -r), as long as the clock ticked;
// an in-place rewrite with the same size within one clock tick can be
// missed, which is why writers should rename.
//
// The only change a stamp can miss is an ABA: at least two replacements
// between two looks, where the last one reuses the inode number of the file
// seen before and also matches its size, mtime and ctime to the nanosecond.
type stamp struct {
	fi    os.FileInfo // nil when the file could not be stat'ed
	ctime int64
}

func statStamp(path string) stamp {
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{}
	}
	return stamp{fi: fi, ctime: ctimeNano(fi)}
}

func fileStamp(f *os.File) stamp {
	fi, err := f.Stat()
	if err != nil {
		return stamp{}
	}
	return stamp{fi: fi, ctime: ctimeNano(fi)}
}

func (a stamp) equal(b stamp) bool {
	if a.fi == nil || b.fi == nil {
		return a.fi == nil && b.fi == nil
	}
	return os.SameFile(a.fi, b.fi) &&
		a.fi.Size() == b.fi.Size() &&
		a.fi.ModTime().Equal(b.fi.ModTime()) &&
		a.ctime == b.ctime
}
