package audit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nvmegate/nvmegate/attest"
	bolt "go.etcd.io/bbolt"
)

// C2SP tlog-tiles paths.

// tileIndexPath encodes a tile index as tlog-tiles does: 3-digit decimal
// groups, all but the last prefixed with "x" (1234067 → x001/x234/067).
func tileIndexPath(n uint64) string {
	s := fmt.Sprintf("%03d", n%1000)
	for n >= 1000 {
		n /= 1000
		s = fmt.Sprintf("x%03d/%s", n%1000, s)
	}
	return s
}

func widthSuffix(w int) string {
	if w == TileWidth {
		return ""
	}
	return ".p/" + strconv.Itoa(w)
}

// HashTilePath returns the path of hash tile (level, n) of width w.
func HashTilePath(level uint, n uint64, w int) string {
	return "tile/" + strconv.FormatUint(uint64(level), 10) + "/" + tileIndexPath(n) + widthSuffix(w)
}

// EntryBundlePath returns the path of entry bundle n of width w.
func EntryBundlePath(n uint64, w int) string {
	return "tile/entries/" + tileIndexPath(n) + widthSuffix(w)
}

// ParseTilePath parses a tile path (relative, slash-separated) into its
// level ("entries" gives -1), index and width. It accepts only the
// canonical encoding.
func ParseTilePath(p string) (level int, n uint64, width int, err error) {
	bad := fmt.Errorf("not a tile path: %q", p)
	rest, ok := strings.CutPrefix(p, "tile/")
	if !ok {
		return 0, 0, 0, bad
	}
	lv, rest, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	if lv == "entries" {
		level = -1
	} else {
		l, err := strconv.ParseUint(lv, 10, 8)
		if err != nil || strconv.FormatUint(l, 10) != lv || l > 7 {
			return 0, 0, 0, bad
		}
		level = int(l)
	}
	width = TileWidth
	if i := strings.Index(rest, ".p/"); i >= 0 {
		w, err := strconv.Atoi(rest[i+3:])
		if err != nil || w < 1 || w >= TileWidth || strconv.Itoa(w) != rest[i+3:] {
			return 0, 0, 0, bad
		}
		width, rest = w, rest[:i]
	}
	parts := strings.Split(rest, "/")
	for i, part := range parts {
		last := i == len(parts)-1
		if !last {
			if !strings.HasPrefix(part, "x") {
				return 0, 0, 0, bad
			}
			part = part[1:]
		}
		if len(part) != 3 || strings.Trim(part, "0123456789") != "" {
			return 0, 0, 0, bad
		}
		d, _ := strconv.ParseUint(part, 10, 64)
		if n > (1<<64-1)/1000 {
			return 0, 0, 0, bad
		}
		n = n*1000 + d
	}
	if tileIndexPath(n) != rest {
		return 0, 0, 0, bad
	}
	return level, n, width, nil
}

// Export writes the log up to treeSize (0: the latest checkpoint) to dir in
// the C2SP tlog-tiles layout, for auditors to verify offline (Verify):
//
//	checkpoint                 the signed checkpoint of treeSize
//	tile/<L>/<N>[.p/<W>]       hash tiles
//	tile/entries/<N>[.p/<W>]   entry bundles
//	checkpoints/<size>         every earlier signed checkpoint (extension)
//	keys/v<N>.pem, v<N>.vkey   public key of every signing-key version
//
// treeSize must be the size of a stored checkpoint (ErrNoCheckpoint). dir
// must not exist or be empty. The export is read in bounded transactions so
// that appends continue meanwhile.
func (l *Log) Export(ctx context.Context, dir string, treeSize uint64) (Checkpoint, error) {
	var cp Checkpoint
	var err error
	if treeSize == 0 {
		cp, err = l.LatestCheckpoint()
	} else {
		cp, err = l.CheckpointAt(treeSize)
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
	}
	if err := prepareDir(dir); err != nil {
		return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
	}
	w := &exportWriter{root: dir}
	w.write("checkpoint", cp.Note)

	// Earlier checkpoints.
	err = l.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketCheckpoints).ForEach(func(k, v []byte) error {
			if s := beUint64(k); s < cp.Size {
				w.write("checkpoints/"+strconv.FormatUint(s, 10), v)
			}
			return w.err
		})
	})
	if err == nil {
		err = w.err
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
	}

	keys, err := l.SigningKeys()
	if err != nil {
		return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
	}
	if err := attest.WritePublicKeys(filepath.Join(dir, "keys"), l.origin, dedupeVersions(keys)); err != nil {
		return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
	}

	// Hash tiles, then entry bundles, 64 tiles per read transaction.
	size := cp.Size
	const perTx = 64
	for level := uint(0); size>>(8*level) > 0; level++ {
		count := size >> (8 * level)
		tiles := (count + TileWidth - 1) / TileWidth
		for n0 := uint64(0); n0 < tiles; n0 += perTx {
			if err := ctx.Err(); err != nil {
				return Checkpoint{}, err
			}
			err := l.view(func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketTiles)
				for n := n0; n < min(tiles, n0+perTx); n++ {
					width := int(min(TileWidth, count-n*TileWidth))
					t := b.Get(tileKey(level, n))
					if len(t) < width*32 {
						return fmt.Errorf("%w: tile %d/%d has %d hashes, want %d", ErrCorrupt, level, n, len(t)/32, width)
					}
					w.write(HashTilePath(level, n, width), t[:width*32])
				}
				return w.err
			})
			if err != nil {
				return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
			}
		}
	}
	bundles := (size + TileWidth - 1) / TileWidth
	for n0 := uint64(0); n0 < bundles; n0 += perTx {
		if err := ctx.Err(); err != nil {
			return Checkpoint{}, err
		}
		err := l.view(func(tx *bolt.Tx) error {
			last := min(bundles, n0+perTx)
			var buf []byte
			var cur uint64 = n0
			flush := func() {
				width := int(min(TileWidth, size-cur*TileWidth))
				w.write(EntryBundlePath(cur, width), buf)
				buf = buf[:0]
				cur++
			}
			err := forEachEntry(tx, n0*TileWidth, min(size, last*TileWidth), func(i uint64, d []byte) error {
				if i/TileWidth != cur {
					flush()
				}
				buf = appendRecord(buf, d)
				return nil
			})
			if err != nil {
				return err
			}
			flush()
			return w.err
		})
		if err != nil {
			return Checkpoint{}, fmt.Errorf("audit: export: %w", err)
		}
	}
	return cp, nil
}

// dedupeVersions keeps key file names unique when two keys share a version
// number (a switch of key backend restarts numbering): later duplicates get
// version numbers above all others. The keys' versions are informational;
// verification matches keys by their note key ID.
func dedupeVersions(keys []attest.PublicKey) []attest.PublicKey {
	seen := map[uint64]bool{}
	var maxV uint64
	for _, k := range keys {
		maxV = max(maxV, k.Version)
	}
	out := make([]attest.PublicKey, len(keys))
	for i, k := range keys {
		if seen[k.Version] {
			maxV++
			k.Version = maxV
		}
		seen[k.Version] = true
		out[i] = k
	}
	return out
}

func prepareDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return os.MkdirAll(dir, 0o755)
	case err != nil:
		return err
	case len(ents) > 0:
		return fmt.Errorf("%s is not empty", dir)
	}
	return nil
}

type exportWriter struct {
	root string
	err  error
	dirs map[string]bool
}

func (w *exportWriter) write(rel string, data []byte) {
	if w.err != nil {
		return
	}
	p := filepath.Join(w.root, filepath.FromSlash(rel))
	d := path.Dir(rel)
	if w.dirs == nil {
		w.dirs = map[string]bool{}
	}
	if !w.dirs[d] {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			w.err = err
			return
		}
		w.dirs[d] = true
	}
	w.err = os.WriteFile(p, data, 0o644)
}

func beUint64(b []byte) uint64 {
	if len(b) != 8 {
		return 1<<64 - 1
	}
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// ExportRecords reads the first size entries of the export in dir (as
// Export wrote it), with their leaf hashes: what a report renders after
// Verify checked the export. An entry that is missing or does not decode
// is an error naming it; Verify says more.
func ExportRecords(dir string, size uint64) ([]Record, error) {
	src := &dirSource{root: dir}
	out := make([]Record, 0, size)
	var buf []byte
	for n := uint64(0); n*TileWidth < size; n++ {
		width := int(min(size-n*TileWidth, TileWidth))
		recs, loc, ok, err := src.bundle(n, width, &buf)
		if err != nil {
			return nil, fmt.Errorf("audit: export %s: %w", loc, err)
		}
		if !ok || len(recs) < width {
			return nil, fmt.Errorf("audit: export %s: entries missing", loc)
		}
		for i, raw := range recs[:width] {
			idx := n*TileWidth + uint64(i)
			e, err := DecodeEntry(raw)
			if err != nil {
				return nil, fmt.Errorf("audit: export entry %d: %w", idx, err)
			}
			out = append(out, Record{Index: idx, LeafHash: LeafHash(raw), Entry: e, Raw: slices.Clone(raw)})
		}
	}
	return out, nil
}
