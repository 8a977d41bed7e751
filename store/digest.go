package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	bolt "go.etcd.io/bbolt"
)

// StateDigest is the canonical digest of the store's state: SHA-256 over
// every record and index key and value, bucket by bucket in a fixed
// order and keys in order, each length-prefixed, with the revision they
// are at. Two stores with one digest hold the same state; a replay of
// the journal must reach the digest of the store it was replayed for.
func (db *DB) StateDigest(ctx context.Context) (rev uint64, digest string, err error) {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	field := func(b []byte) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
		h.Write(b)
	}
	err = db.view(ctx, func(tx *bolt.Tx) error {
		rev = db.model.rev.Load()
		for _, name := range allBuckets {
			if bytes.Equal(name, bucketMeta) {
				continue
			}
			field(name)
			if err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				field(k)
				field(v)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	h.Write(binary.BigEndian.AppendUint64(nil, rev))
	return rev, "sha256:" + hex.EncodeToString(h.Sum(nil)), err
}
