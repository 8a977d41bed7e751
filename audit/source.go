package audit

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// maxBundleSize bounds an entry bundle file: 256 records of at most
// MaxEntrySize bytes, plus slack to notice extra records.
const maxBundleSize = 2 * TileWidth * (2 + MaxEntrySize)

// dirSource reads an export directory.
type dirSource struct {
	root string
}

func (d *dirSource) read(rel string, limit int64) ([]byte, bool, error) {
	return d.readInto(rel, limit, nil)
}

// readInto reads the file at rel (at most limit bytes) into *buf, growing
// it as needed, or into a new slice if buf is nil.
func (d *dirSource) readInto(rel string, limit int64, buf *[]byte) ([]byte, bool, error) {
	f, err := os.Open(filepath.Join(d.root, filepath.FromSlash(rel)))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, false, nil
	}
	n := min(fi.Size(), limit)
	var data []byte
	if buf != nil && int64(cap(*buf)) >= n {
		data = (*buf)[:n]
	} else {
		data = make([]byte, n)
		if buf != nil {
			*buf = data
		}
	}
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, false, err
	}
	return data, true, nil
}

func (d *dirSource) checkpoint() ([]byte, string, error) {
	data, ok, err := d.read("checkpoint", MaxCheckpointSize)
	if err != nil {
		return nil, "checkpoint", err
	}
	if !ok {
		return nil, "checkpoint", errors.New("the export has no checkpoint file")
	}
	return data, "checkpoint", nil
}

func (d *dirSource) history() ([]located, error) {
	ents, err := os.ReadDir(filepath.Join(d.root, "checkpoints"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	type h struct {
		size uint64
		l    located
	}
	var hs []h
	for _, e := range ents {
		s, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		rel := "checkpoints/" + e.Name()
		data, ok, err := d.read(rel, MaxCheckpointSize)
		if err != nil {
			return nil, err
		}
		if ok {
			hs = append(hs, h{s, located{data, rel}})
		}
	}
	slices.SortFunc(hs, func(a, b h) int { return cmp.Compare(a.size, b.size) })
	out := make([]located, len(hs))
	for i := range hs {
		out[i] = hs[i].l
	}
	return out, nil
}

func (d *dirSource) bundle(n uint64, width int, buf *[]byte) ([][]byte, string, bool, error) {
	want := EntryBundlePath(n, width)
	data, ok, err := d.readInto(want, maxBundleSize, buf)
	if err != nil {
		return nil, want, false, err
	}
	loc := want
	if !ok {
		// Another width of the same bundle: truncated or extended by hand.
		for _, alt := range d.variants(n) {
			if alt == want {
				continue
			}
			if data, ok, err = d.readInto(alt, maxBundleSize, buf); err != nil {
				return nil, alt, false, err
			}
			if ok {
				loc = alt
				break
			}
		}
	}
	if !ok {
		return nil, want, false, nil
	}
	recs, _ := splitRecords(data) // a malformed tail shows as missing entries
	return recs, loc, true, nil
}

// variants lists the existing files of entry bundle n, of any width.
func (d *dirSource) variants(n uint64) []string {
	var out []string
	full := EntryBundlePath(n, TileWidth)
	if _, ok, _ := d.read(full, 0); ok {
		out = append(out, full)
	}
	ents, _ := os.ReadDir(filepath.Join(d.root, filepath.FromSlash(full+".p")))
	for _, e := range ents {
		out = append(out, full+".p/"+e.Name())
	}
	return out
}

func (d *dirSource) tile(level uint, n uint64, width int) ([]byte, string, bool, error) {
	p := HashTilePath(level, n, width)
	data, ok, err := d.read(p, TileWidth*32)
	if err != nil || !ok {
		return nil, p, false, err
	}
	if len(data) != width*32 {
		return nil, p, false, nil
	}
	return data, p, true, nil
}

func (d *dirSource) beyond(size uint64) ([]string, error) {
	var out []string
	root := filepath.Join(d.root, "tile", "entries")
	err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if e.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(d.root, p)
		rel = filepath.ToSlash(rel)
		lv, n, w, perr := ParseTilePath(rel)
		if perr != nil || lv != -1 {
			out = append(out, rel)
			return nil
		}
		if last := (size - 1) / TileWidth; size > 0 && n == last && uint64(w) > size-last*TileWidth {
			out = append(out, rel) // a wider copy of the last bundle
			return nil
		}
		// Bundles after the last one the checkpoint covers. (A wider file
		// of the last bundle is reported by bundle/verify.)
		if size == 0 || n > (size-1)/TileWidth {
			out = append(out, rel)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// CheckFile verifies an audit log's bbolt file offline, the way Verify
// checks an export: the latest stored checkpoint (against keys), the
// entries and hash tiles under it, every stored checkpoint, since if not
// nil, and entries stored beyond the tree. Locations name entries
// ("entries/<index>") and tiles ("tiles/<level>/<n>"). The file is opened
// read-only; a running gateway holding it makes CheckFile fail with
// ErrLocked (export instead).
func CheckFile(ctx context.Context, path string, keys []attest.PublicKey, since []byte, progress ProgressFunc) (*Report, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("audit: check %s: %w", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: check %s: %w", path, err)
	}
	defer db.Close()
	tx, err := db.Begin(false)
	if err != nil {
		return nil, fmt.Errorf("audit: check %s: %w", path, err)
	}
	defer tx.Rollback()
	if err := checkMeta(tx.Bucket(bucketMeta), ""); err != nil {
		return nil, fmt.Errorf("audit: check %s: %w", path, err)
	}
	for _, name := range allBuckets {
		if tx.Bucket(name) == nil {
			return nil, fmt.Errorf("audit: check %s: %w: bucket %s missing", path, ErrCorrupt, name)
		}
	}
	return verify(ctx, &boltSource{tx: tx}, keys, since, progress)
}

// boltSource reads a bbolt file, tolerating what a tamperer may have done
// to it: records are placed by chunk key and position, holes are nil.
type boltSource struct {
	tx *bolt.Tx
}

func (b *boltSource) checkpoint() ([]byte, string, error) {
	k, v := b.tx.Bucket(bucketCheckpoints).Cursor().Last()
	if k == nil {
		return nil, "checkpoints", errors.New("the log has no checkpoint")
	}
	return slices.Clone(v), "checkpoints/" + strconv.FormatUint(beUint64(k), 10), nil
}

func (b *boltSource) history() ([]located, error) {
	var out []located
	c := b.tx.Bucket(bucketCheckpoints).Cursor()
	last, _ := c.Last()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if string(k) == string(last) {
			break
		}
		out = append(out, located{slices.Clone(v), "checkpoints/" + strconv.FormatUint(beUint64(k), 10)})
	}
	return out, nil
}

func (b *boltSource) bundle(n uint64, width int, _ *[]byte) ([][]byte, string, bool, error) {
	base := n * TileWidth
	recs := make([][]byte, width)
	entries := b.tx.Bucket(bucketEntries)
	c := entries.Cursor()
	k, _ := c.Seek(u64(base))
	if k == nil || beUint64(k) > base {
		if pk, _ := c.Prev(); pk != nil {
			k = pk
		} else {
			k, _ = c.Seek(u64(base))
		}
	}
	found := false
	var extra int
	for ; k != nil && beUint64(k) < base+uint64(width); k, _ = c.Next() {
		first := beUint64(k)
		rs, _ := splitRecords(chunkData(entries, k))
		for j, r := range rs {
			i := first + uint64(j)
			switch {
			case i < base:
			case i >= base+uint64(width):
				extra++
			case recs[i-base] != nil:
				extra++ // two chunks claim the index
			default:
				recs[i-base] = r
				found = true
			}
		}
	}
	loc := fmt.Sprintf("entries/%d-%d", base, base+uint64(width)-1)
	if extra > 0 && beUint64(k) >= base+uint64(width) {
		extra = 0 // records of the next bundle, checked there
	}
	return recs, loc, found, nil
}

func (b *boltSource) tile(level uint, n uint64, width int) ([]byte, string, bool, error) {
	loc := fmt.Sprintf("tiles/%d/%d", level, n)
	t := b.tx.Bucket(bucketTiles).Get(tileKey(level, n))
	if len(t) < width*32 {
		return nil, loc, false, nil
	}
	return slices.Clone(t[:width*32]), loc, true, nil
}

// beyond reports entries stored at indexes ≥ size beyond the tree state:
// the tree state (meta) says how many entries were appended; entries past
// it were added by hand. Entries between the checkpoint and the tree size
// are the normal unsigned tail and are not reported.
func (b *boltSource) beyond(size uint64) ([]string, error) {
	treeSize := size
	if v := b.tx.Bucket(bucketMeta).Get(metaTree); len(v) >= 8 {
		treeSize = max(size, binary.BigEndian.Uint64(v))
	}
	entries := b.tx.Bucket(bucketEntries)
	c := entries.Cursor()
	var out []string
	for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
		first := beUint64(k)
		rs, _ := splitRecords(chunkData(entries, k))
		end := first + uint64(len(rs))
		if end <= treeSize {
			break
		}
		out = append(out, fmt.Sprintf("entries/%d", max(first, treeSize)))
	}
	slices.Reverse(out)
	return out, nil
}
