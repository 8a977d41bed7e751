package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// Write is one key put (Value) or deleted (Delete) of a change: what a
// change's payload in the journal holds (EncodeWrites), in the layout of
// the file (doc.go), by bucket.
type Write struct {
	Bucket, Key, Value []byte
	Delete             bool
}

// replicatedBuckets are the buckets a change may write: the records and
// their indexes, and the revision.
var replicatedBuckets = func() map[string]bool {
	m := map[string]bool{}
	for _, b := range allBuckets {
		m[string(b)] = true
	}
	return m
}()

// Sync brings a replica's projection up to the replicated journal's head
// as read now (a read barrier: every call of a replica passes it, the
// leader's too). On a gateway running alone it does nothing: every change
// is its own.
func (db *DB) Sync(ctx context.Context) error {
	if db.lead.forward == nil {
		return nil
	}
	return db.syncJournal(ctx)
}

// syncJournal is Sync on a replica that projects a replicated journal:
// the journal's copy reaches the replicated log's head (one read of etcd,
// shared by the calls waiting at that moment), then the store applies
// what it brought. The leader passes it too: it holds every change it
// sequenced, but one deposed while paused or cut off from etcd believes
// it leads until its lease runs out where it runs, and must neither serve
// a state another leader has moved on from nor serve at all while it
// cannot read etcd.
func (db *DB) syncJournal(ctx context.Context) error {
	if err := db.journal.Barrier(ctx); err != nil {
		return fmt.Errorf("store: catching up with the replicated journal: %w", err)
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	return db.projectLocked()
}

// syncTimeout bounds a catch-up with the replicated journal at Open.
const syncTimeout = 10 * time.Second

// revokedScopes names the key scopes of the grants ops store as revoked.
func revokedScopes(ops []op) []string {
	var out []string
	for _, o := range ops {
		if o.grant != nil && !o.del && o.grant.State == nvmegate.GrantRevoked {
			out = append(out, o.grant.Scope())
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(out)))
}

// touched names the targets and subsystems whose desired state ops may
// change.
func touched(ops []op) (targets, subsystems []string) {
	for _, o := range ops {
		switch {
		case o.target != nil:
			targets = append(targets, o.target.ID)
		case o.subsystem != nil:
			targets = append(targets, o.subsystem.TargetID)
			subsystems = append(subsystems, o.subsystem.NQN)
		case o.namespace != nil:
			subsystems = append(subsystems, o.namespace.SubsystemNQN)
		case o.grant != nil:
			subsystems = append(subsystems, o.grant.SubsystemNQN)
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(targets))), slices.Compact(slices.Sorted(slices.Values(subsystems)))
}

// opOf is the model's op for write w (nil for an index or the revision):
// a put decoded, a delete of the record as this copy holds it before w.
func (db *DB) opOf(btx *bolt.Tx, w Write) (*op, error) {
	if w.Delete {
		old := btx.Bucket(w.Bucket).Get(w.Key)
		if old == nil {
			return nil, nil
		}
		o, err := decodeOp(w.Bucket, old)
		if o != nil {
			o.del = true
		}
		if err != nil {
			// A record this copy cannot read goes all the same.
			return deletedKeyOp(w.Bucket, w.Key), nil
		}
		return o, nil
	}
	return decodeOp(w.Bucket, w.Value)
}

// decodeOp decodes a record of bucket as the op that stores it.
func decodeOp(bucket, v []byte) (*op, error) {
	var (
		o   op
		err error
	)
	switch {
	case bytes.Equal(bucket, bucketTargets):
		o.target, err = decodeTarget(v)
	case bytes.Equal(bucket, bucketSubsystems):
		o.subsystem, err = decodeSubsystem(v)
	case bytes.Equal(bucket, bucketNamespaces):
		o.namespace, err = decodeNamespace(v)
	case bytes.Equal(bucket, bucketHostBindings):
		o.binding, err = decodeHostBinding(v)
	case bytes.Equal(bucket, bucketJobs):
		var j *nvmegate.Job
		if j, err = decodeJob(v); err == nil {
			o.job = clipJob(j)
		}
	case bytes.Equal(bucket, bucketPolicy):
		o.policy, err = decodePolicy(v)
	case bytes.Equal(bucket, bucketRoots):
		o.root, err = decodeRootRotation(v)
	case bytes.Equal(bucket, bucketGrants):
		o.grant, err = decodeGrant(v)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// deletedKeyOp is the delete of an unreadable record by its key alone,
// for the records whose model entry the key names.
func deletedKeyOp(bucket, k []byte) *op {
	switch {
	case bytes.Equal(bucket, bucketTargets):
		return &op{del: true, target: &nvmegate.Target{ID: string(k)}}
	case bytes.Equal(bucket, bucketNamespaces) && len(k) > 5:
		return &op{del: true, namespace: &nvmegate.Namespace{SubsystemNQN: string(k[:len(k)-5]), NSID: binary.BigEndian.Uint32(k[len(k)-4:])}}
	}
	return nil
}

// emptyRecords empties every bucket but the meta: a snapshot is loaded
// in its place.
func emptyRecords(btx *bolt.Tx) error {
	for _, name := range allBuckets {
		if bytes.Equal(name, bucketMeta) {
			continue
		}
		if err := btx.DeleteBucket(name); err != nil {
			return err
		}
		if _, err := btx.CreateBucket(name); err != nil {
			return err
		}
	}
	return nil
}

// Dump calls fn with every key of this copy's records and indexes (the
// writes a snapshot of it is made of), read in one transaction, and
// returns the revision they are at: what a leader writes as the
// replicated store's snapshot before it trims the changes it covers.
func (db *DB) Dump(ctx context.Context, fn func(Write) error) (uint64, error) {
	var rev uint64
	err := db.view(ctx, func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaRevision); len(v) == 8 {
			rev = binary.BigEndian.Uint64(v)
		}
		if db.journal != nil {
			// The open transaction holds every durable change; its meta
			// is the last checkpoint's.
			rev = db.model.rev.Load()
		}
		for _, name := range allBuckets {
			if bytes.Equal(name, bucketMeta) {
				continue
			}
			if err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				return fn(Write{Bucket: name, Key: k, Value: v})
			}); err != nil {
				return err
			}
		}
		return nil
	})
	return rev, err
}
