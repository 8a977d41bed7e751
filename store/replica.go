package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

// Replica keeps the store beyond this machine: in a deployment of several
// gateway replicas, the records live in a replicated store (etcdstore, on
// etcd) and each replica's file is its copy of them, from which it serves
// reads and its read model as a single gateway does.
//
// The replica orders the writes: Commit is a compare-and-swap on the
// store's revision, so a write transaction commits only on top of the
// revision it read (no lost update between replicas). One that lost the
// race applies the changes it missed and runs again on top of them.
type Replica interface {
	// Commit stores ch iff the replicated store is at revision
	// ch.Revision-1. Otherwise it stores nothing and returns an error
	// wrapping ErrConflict. A context may carry a condition of the
	// replica's own (a leader's fence); if that fails, nothing is stored
	// and the error says so.
	Commit(ctx context.Context, ch Change) error
	// Changes calls fn with each change after revision from, in order. If
	// a change this copy needs is no longer kept, it returns ErrResync.
	Changes(ctx context.Context, from uint64, fn func(Change) error) error
	// Snapshot calls fn with every key of the latest snapshot, and
	// returns its revision (a full resync; the changes after it follow).
	Snapshot(ctx context.Context, fn func(w Write) error) (uint64, error)
	// Revision is the replicated store's latest revision, read
	// linearizably: every change committed before the call is at or
	// below it.
	Revision(ctx context.Context) (uint64, error)
}

// Change is one committed write transaction: the revision it made and
// the keys it wrote, in the layout of the file (doc.go), by bucket.
type Change struct {
	Revision uint64
	Writes   []Write
}

// Write is one key put (Value) or deleted (Delete).
type Write struct {
	Bucket, Key, Value []byte
	Delete             bool
}

var (
	// ErrConflict is what a Replica's Commit wraps when the replicated
	// store moved past the revision the transaction read.
	ErrConflict = errors.New("store: the replicated store moved on")
	// ErrResync is what a Replica's Changes returns when the changes after
	// a copy's revision are no longer kept: the copy loads a snapshot.
	ErrResync = errors.New("store: the changes after this copy's revision are no longer kept")
)

// Conflict is what a Replica's Commit may return on a conflict: the
// changes committed from the revision the transaction would have made on
// (some or all of them, in order), so that the copy catches up with no
// further round trip and runs the transaction again at once — a replica
// that lost a race must not also lose the next one by catching up slowly.
type Conflict struct{ Changes []Change }

func (c *Conflict) Error() string { return ErrConflict.Error() }
func (c *Conflict) Unwrap() error { return ErrConflict }

// maxConflicts bounds the catch-up-and-retry rounds of one write: each
// round means another replica committed, so the store as a whole moved
// on.
const maxConflicts = 64

// replicatedBuckets are the buckets a change may write: the records and
// their indexes, and the revision.
var replicatedBuckets = func() map[string]bool {
	m := map[string]bool{}
	for _, b := range allBuckets {
		m[string(b)] = true
	}
	return m
}()

// Sync brings this copy up to the replicated store: it applies every
// change other replicas committed since its revision (or, if those are no
// longer kept, loads a snapshot). Without a Replica it does nothing.
//
// Concurrent calls share the work: a call waits for the next catch-up
// that starts after it arrived (which sees everything committed before
// it), so a storm of callers costs one read of etcd per round, not one
// each — the read barrier every replicated decision passes.
func (db *DB) Sync(ctx context.Context) error {
	if db.lead.forward != nil {
		return db.syncJournal(ctx)
	}
	if db.replica == nil {
		return nil
	}
	return db.syncs.Do(ctx, db.syncRound)
}

// syncJournal is Sync on a replica that projects a replicated journal:
// the journal's copy reaches the replicated log's head (one read of etcd,
// shared by the calls waiting at that moment), then the store applies
// what it brought. The leader holds every change already: it sequenced
// them.
func (db *DB) syncJournal(ctx context.Context) error {
	if _, ok := db.leading(); ok {
		return nil
	}
	if err := db.journal.Barrier(ctx); err != nil {
		return fmt.Errorf("store: catching up with the replicated journal: %w", err)
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	return db.projectLocked()
}

// syncRound is one round of a replicated store's Sync.
func (db *DB) syncRound() error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	// The revision first, without the write lock: a copy already at it
	// (its own commits, or a catch-up since) has nothing to do, and the
	// writers do not wait for the round trip. (One ahead of it is
	// refused by the catch-up.)
	rev, err := db.replica.Revision(ctx)
	if err == nil && rev != db.model.rev.Load() {
		db.writeMu.Lock()
		err = db.catchUpLocked(ctx)
		db.writeMu.Unlock()
	}
	return err
}

// syncTimeout bounds one catch-up round.
const syncTimeout = 10 * time.Second

func (db *DB) catchUpLocked(ctx context.Context) error {
	apply := func(ch Change) error { return db.applyChange(ch) }
	err := db.replica.Changes(ctx, db.model.rev.Load(), apply)
	if errors.Is(err, ErrResync) {
		// The snapshot, then the changes after it.
		if err = db.resyncLocked(ctx); err == nil {
			err = db.replica.Changes(ctx, db.model.rev.Load(), apply)
		}
	}
	if err != nil {
		return fmt.Errorf("store: catching up with the replicated store: %w", err)
	}
	return nil
}

// applyChange writes another replica's change into this copy and plays
// it onto the model. writeMu is held.
func (db *DB) applyChange(ch Change) error {
	rev := db.model.rev.Load()
	if ch.Revision != rev+1 {
		return fmt.Errorf("store: replicated change %d where %d was due: a gap", ch.Revision, rev+1)
	}
	var ops []op
	err := db.bolt.Update(func(btx *bolt.Tx) error {
		for _, w := range ch.Writes {
			if !replicatedBuckets[string(w.Bucket)] {
				return fmt.Errorf("store: replicated change %d writes bucket %q", ch.Revision, w.Bucket)
			}
			o, err := db.opOf(btx, w)
			if err != nil {
				return fmt.Errorf("store: replicated change %d: %w", ch.Revision, err)
			}
			if o != nil {
				ops = append(ops, *o)
			}
			b := btx.Bucket(w.Bucket)
			if w.Delete {
				err = b.Delete(w.Key)
			} else {
				err = b.Put(w.Key, w.Value)
			}
			if err != nil {
				return err
			}
		}
		return btx.Bucket(bucketMeta).Put(metaRevision, binary.BigEndian.AppendUint64(nil, ch.Revision))
	})
	if err != nil {
		return err
	}
	// The hook hears of the change before the copy's revision moves: one
	// who reads the revision, then takes what the hook noted, has every
	// change up to that revision (issue 29, defect 11).
	if db.applied != nil {
		targets, subsystems := touched(ops)
		db.applied(ch.Revision, targets, subsystems)
	}
	if db.revoked != nil {
		if scopes := revokedScopes(ops); len(scopes) > 0 {
			db.revoked(scopes)
		}
	}
	db.model.apply(change{revision: ch.Revision, ops: ops})
	return nil
}

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

// resyncLocked replaces this copy with a snapshot of the replicated
// store: every bucket emptied and refilled in one transaction, the model
// loaded again, and every scope feed told that everything changed.
func (db *DB) resyncLocked(ctx context.Context) error {
	btx, err := db.bolt.Begin(true)
	if err != nil {
		return beginError(err)
	}
	defer func() { _ = btx.Rollback() }()
	if err := emptyRecords(btx); err != nil {
		return err
	}
	rev, err := db.replica.Snapshot(ctx, func(w Write) error {
		if !replicatedBuckets[string(w.Bucket)] || w.Delete {
			return fmt.Errorf("store: snapshot key in bucket %q", w.Bucket)
		}
		if bytes.Equal(w.Bucket, bucketMeta) {
			return nil // the revision is the snapshot's
		}
		return btx.Bucket(w.Bucket).Put(w.Key, w.Value)
	})
	if err != nil {
		return fmt.Errorf("store: resync: %w", err)
	}
	if err := btx.Bucket(bucketMeta).Put(metaRevision, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
		return err
	}
	recs, _, err := load(btx)
	if err != nil {
		return fmt.Errorf("store: resync: %w", err)
	}
	if err := btx.Commit(); err != nil {
		return fmt.Errorf("store: resync: commit: %w", err)
	}
	if db.applied != nil { // before the revision moves, as for a change
		var targets []string
		for id := range recs.targets {
			targets = append(targets, id)
		}
		slices.Sort(targets)
		db.applied(rev, targets, nil)
	}
	db.model.replace(recs, rev)
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

// applyConflict catches up after a lost race: with the changes the
// conflict carried, or by reading them.
func (db *DB) applyConflict(ctx context.Context, err error) error {
	var c *Conflict
	if !errors.As(err, &c) || len(c.Changes) == 0 {
		return db.catchUpLocked(ctx)
	}
	for _, ch := range c.Changes {
		if ch.Revision <= db.model.rev.Load() {
			continue
		}
		if ch.Revision != db.model.rev.Load()+1 {
			return db.catchUpLocked(ctx)
		}
		if err := db.applyChange(ch); err != nil {
			return err
		}
	}
	return nil
}
