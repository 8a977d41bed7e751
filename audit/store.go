package audit

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Storage primitives over the bbolt buckets; doc.go describes the layout.
//
// The writer commits a batch of appends with a handful of puts whatever the
// batch size: one entry chunk, the touched hash tiles, one posting per
// distinct index key, the tree state. That, not the fsync, is what bounds
// throughput on two cores.

// TileWidth is the number of hashes in a full hash tile and the number of
// entries in a full entry bundle (C2SP tlog-tiles).
const TileWidth = 256

// tileKey is the tiles bucket key: tile level (tree level / 8), tile index.
func tileKey(level uint, n uint64) []byte {
	k := make([]byte, 9)
	k[0] = byte(level)
	binary.BigEndian.PutUint64(k[1:], n)
	return k
}

// nodeReader returns node hashes from the stored tiles, caching the tiles
// it read for the life of one read transaction.
type nodeReader struct {
	b     *bolt.Bucket
	cache map[string][]byte
}

func newNodeReader(tx *bolt.Tx) *nodeReader {
	return &nodeReader{b: tx.Bucket(bucketTiles), cache: map[string][]byte{}}
}

func (r *nodeReader) tile(level uint, n uint64) []byte {
	k := tileKey(level, n)
	if t, ok := r.cache[string(k)]; ok {
		return t
	}
	t := r.b.Get(k)
	r.cache[string(k)] = t
	return t
}

// node returns the hash of the perfect subtree (level, index). Nodes of a
// tree level that is not a multiple of 8 are not stored: they are rehashed
// from the ≤ 128 nodes of the tile level below them.
func (r *nodeReader) node(level uint, index uint64) ([]byte, error) {
	tl, rest := level/8, level%8
	first := index << rest
	n := uint64(1) << rest
	t := r.tile(tl, first/TileWidth)
	off := first % TileWidth
	if uint64(len(t)) < (off+n)*32 {
		return nil, fmt.Errorf("%w: node (%d,%d) not stored (tile %d/%d has %d hashes)", ErrCorrupt, level, index, tl, first/TileWidth, len(t)/32)
	}
	if n == 1 {
		return t[off*32 : off*32+32 : off*32+32], nil
	}
	hs := make([][]byte, n)
	for i := range hs {
		p := (off + uint64(i)) * 32
		hs[i] = t[p : p+32 : p+32]
	}
	for len(hs) > 1 {
		for i := 0; i < len(hs)/2; i++ {
			hs[i] = hasher.HashChildren(hs[2*i], hs[2*i+1])
		}
		hs = hs[:len(hs)/2]
	}
	return hs[0], nil
}

// appendRecord appends data to b as a C2SP entry-bundle record: a 16-bit
// big-endian length, then the bytes.
func appendRecord(b, data []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

// splitRecords splits a chunk or bundle into its records.
func splitRecords(b []byte) ([][]byte, error) {
	var out [][]byte
	for len(b) > 0 {
		if len(b) < 2 {
			return out, fmt.Errorf("truncated record length")
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return out, fmt.Errorf("record of %d bytes truncated to %d", n, len(b)-2)
		}
		out = append(out, b[2:2+n:2+n])
		b = b[2+n:]
	}
	return out, nil
}

// Entry chunks. Each commit stores its entries as one chunk of entry-bundle
// records under its first index. The chunk is the single value of a nested
// bucket: bbolt rewrites a whole leaf page when a key is added to it, and
// a leaf holds at least two keys however large their values, so chunks
// stored directly in one bucket would be rewritten up to three times. In
// their own buckets only the parent's small leaf of bucket headers is.
var chunkKey = []byte("d")

func putChunk(tx *bolt.Tx, start uint64, chunk []byte) error {
	entries := tx.Bucket(bucketEntries)
	entries.FillPercent = 1 // append-only: pack pages full
	b, err := entries.CreateBucket(u64(start))
	if err != nil {
		return err
	}
	b.FillPercent = 1
	return b.Put(chunkKey, chunk)
}

// chunkData returns the chunk stored under key k, nil if there is none.
func chunkData(entries *bolt.Bucket, k []byte) []byte {
	b := entries.Bucket(k)
	if b == nil {
		return nil
	}
	return b.Get(chunkKey)
}

// forEachEntry calls fn for the stored entries with indexes in [from, to),
// in order, reading the chunk that holds from and the following ones. The
// data slices are valid only during the transaction. A gap or overlap
// between chunks is ErrCorrupt: nothing is skipped silently.
func forEachEntry(tx *bolt.Tx, from, to uint64, fn func(index uint64, data []byte) error) error {
	if from >= to {
		return nil
	}
	entries := tx.Bucket(bucketEntries)
	c := entries.Cursor()
	k, _ := c.Seek(u64(from))
	if k == nil || binary.BigEndian.Uint64(k) > from {
		k, _ = c.Prev()
	}
	next := from
	for ; k != nil && next < to; k, _ = c.Next() {
		v := chunkData(entries, k)
		if len(k) != 8 {
			return fmt.Errorf("%w: entry chunk key %x", ErrCorrupt, k)
		}
		idx := binary.BigEndian.Uint64(k)
		if idx > next {
			return fmt.Errorf("%w: entries %d to %d missing", ErrCorrupt, next, idx-1)
		}
		recs, err := splitRecords(v)
		if err != nil {
			return fmt.Errorf("%w: entry chunk %d: %v", ErrCorrupt, idx, err)
		}
		for _, r := range recs {
			if idx >= next && idx < to {
				if idx != next {
					return fmt.Errorf("%w: entry %d out of sequence", ErrCorrupt, idx)
				}
				if err := fn(idx, r); err != nil {
					return err
				}
				next++
			}
			idx++
		}
	}
	if next < to {
		return fmt.Errorf("%w: entries %d to %d missing", ErrCorrupt, next, to-1)
	}
	return nil
}

// Postings. An index bucket maps prefix || first index (8 bytes) to the
// list of entry indexes with that prefix committed in one batch, as uvarint
// deltas (the first from the key's index, so usually 0).

func encodePostings(first uint64, idxs []uint64) []byte {
	b := make([]byte, 0, len(idxs)*2)
	prev := first
	for _, i := range idxs {
		b = binary.AppendUvarint(b, i-prev)
		prev = i
	}
	return b
}

func decodePostings(key, val []byte) ([]uint64, error) {
	if len(key) < 8 {
		return nil, fmt.Errorf("%w: index key %x", ErrCorrupt, key)
	}
	prev := binary.BigEndian.Uint64(key[len(key)-8:])
	var out []uint64
	for len(val) > 0 {
		d, n := binary.Uvarint(val)
		if n <= 0 {
			return nil, fmt.Errorf("%w: index postings under %x", ErrCorrupt, key)
		}
		prev += d
		out = append(out, prev)
		val = val[n:]
	}
	return out, nil
}
