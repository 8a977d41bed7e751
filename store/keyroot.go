package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
)

// An access root rotation is noted in the store once the key store holds
// the new root, so that it is a change of the log: every replica drops the
// roots it keeps of that scope as it applies the change
// (Options.RootRotated), instead of serving the old root until its next
// refresh. The roots themselves stay in the key store; the store keeps the
// version and fingerprint only.

var bucketRoots = []byte("roots")

// RootRotation is an access root's rotation as the store notes it.
type RootRotation struct {
	Scope       string    `json:"scope"`
	Version     uint64    `json:"version"`
	Fingerprint string    `json:"fingerprint"`
	At          time.Time `json:"at"`
}

func decodeRootRotation(v []byte) (*RootRotation, error) {
	var r RootRotation
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("store: root rotation record: %w", err)
	}
	if r.Scope == "" || r.Version == 0 {
		return nil, fmt.Errorf("store: root rotation record without a scope or version")
	}
	return &r, nil
}

// NoteRootRotated notes that scope's access root is at r.Version. A
// version noted already (or a later one) writes nothing.
func (db *DB) NoteRootRotated(ctx context.Context, r RootRotation) error {
	if r.Scope == "" || r.Version == 0 {
		return nvmegate.Invalid("scope", "a root rotation names its scope and version")
	}
	if nvmegate.LooksLikeKeyMaterial(r.Fingerprint) {
		return nvmegate.Invalid("fingerprint", "a root rotation carries a fingerprint, never a key")
	}
	if db.forwards() {
		if ok, err := db.remote(ctx, "note_root_rotated", &noteRootOp{Rotation: r}); ok {
			return err
		}
	}
	if r.At.IsZero() {
		r.At = db.now().UTC()
	}
	return db.update(ctx, func(tx *txn) error {
		if v := tx.Bucket(bucketRoots).Get([]byte(r.Scope)); v != nil {
			if cur, err := decodeRootRotation(v); err == nil && cur.Version >= r.Version {
				return nil
			}
		}
		val, err := json.Marshal(&r)
		if err != nil {
			return err
		}
		stored := r
		tx.record(op{root: &stored})
		return put(tx, bucketRoots, []byte(r.Scope), val)
	})
}

// NotedRoots are the access root versions the store notes, by scope.
func (db *DB) NotedRoots(ctx context.Context) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := db.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRoots).ForEach(func(k, v []byte) error {
			r, err := decodeRootRotation(v)
			if err != nil {
				return err
			}
			out[string(k)] = r.Version
			return nil
		})
	})
	return out, err
}
