package audit

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	bolt "go.etcd.io/bbolt"
)

// Replica keeps the log beyond this machine: in a deployment of several
// gateway replicas, one log (one origin) whose commits are durable in a
// replicated store (etcdlog, on etcd) before an append returns. Each
// replica's file is then its copy of that log, from which it answers
// queries, proofs and exports as a single gateway does.
//
// The replica is the arbiter of order: Append is a compare-and-swap on
// the tree (its size and root), so of two writers extending the same tree
// one wins and the other learns of the commit it missed, applies it, and
// appends on top of it.
type Replica interface {
	// Append stores c iff the replicated tree is the one c extends: c.Start
	// entries with root c.PrevRoot; or, with c.Pending, the one the first
	// pending commit extends, storing them with c in one step. It returns
	// nil iff c is then in the replicated log: stored now, or before (by a
	// later commit that carried it as pending, or by an attempt whose
	// answer was lost). Otherwise it stores nothing and returns an error
	// wrapping ErrConflict (the tree moved on) or ErrFenced.
	Append(ctx context.Context, c Commit) error
	// Commits calls fn with the stored commits whose Start is from or
	// later, in order; the first starts at from (a gap is an error).
	Commits(ctx context.Context, from uint64, fn func(Commit) error) error
	// PutCheckpoint stores a signed checkpoint unless one of its size or
	// larger is stored, or the condition of ctx (ConditionOf) fails
	// (ErrFenced).
	PutCheckpoint(ctx context.Context, cp ReplicatedCheckpoint) error
	// Checkpoints returns the stored checkpoints of sizes above after, by
	// size.
	Checkpoints(ctx context.Context, after uint64) ([]ReplicatedCheckpoint, error)
	// Head is the replicated tree's size, read linearizably: every commit
	// stored before the call is within it.
	Head(ctx context.Context) (uint64, error)
}

// Commit is one group commit of the replicated log: the entries
// [Start, End) as entry-bundle records (uint16 BE length || bytes), and the
// tree root before and after them. Conditions are the replica's own
// conditions its appenders set (WithCondition: a leader's fence), all of
// which must hold for the commit to be stored.
type Commit struct {
	Start, End     uint64
	PrevRoot, Root [32]byte
	Records        []byte
	Conditions     []any
	// Changes are the payloads of the proposals the commit sequenced
	// (Log.Propose on the term's leader), each beside the entry that
	// records it: a replica's copy stores them with the entries, and its
	// store projects them.
	Changes []ChangeRecord

	// Pending are the commits before this one, oldest first, that the
	// writer sent and has no answer for yet (it pipelines its commits):
	// each ends where the next starts, the last where this one starts.
	// Requests can reach the replica out of order; with them, a commit
	// that overtakes its predecessors stores them too, under their
	// conditions, instead of being refused.
	Pending []Commit
}

// ChangeRecord is one payload of a commit: the revision it makes, the
// index of the entry that records it (and commits to its digest), and
// whether it is a whole state (a snapshot) rather than a change.
type ChangeRecord struct {
	Revision, Index uint64
	Snapshot        bool
	Payload         []byte
}

// ErrFenced is what a Replica's Append wraps when a condition of the
// commit failed (an appender is no longer the leader it was): nothing was
// stored. The log then refuses the appends that carried a condition and
// commits the others.
var ErrFenced = errors.New("audit: a condition of the append failed (no longer the leader); nothing recorded")

type conditionKey struct{}

// WithCondition makes the appends under ctx conditional on c, a condition
// the Replica understands (etcdlog: a clientv3.Cmp, the leader's fence):
// one whose condition fails is refused with ErrFenced. Without a Replica
// conditions are ignored: a single gateway is always its own leader.
func WithCondition(ctx context.Context, c any) context.Context {
	return context.WithValue(ctx, conditionKey{}, c)
}

// ConditionOf is ctx's condition (WithCondition), or nil: a Replica's
// PutCheckpoint, which the leader's Checkpointer calls under its term's
// context, stores nothing once it fails.
func ConditionOf(ctx context.Context) any { return ctx.Value(conditionKey{}) }

// ReplicatedCheckpoint is a signed checkpoint note and the key version
// and public key (PEM) that signed it, for the replicas that did not.
type ReplicatedCheckpoint struct {
	Note       []byte
	KeyVersion uint64
	KeyPEM     []byte
}

// ErrConflict is what a Replica's Append wraps when the replicated tree
// is not the one the commit extends: another writer appended first.
var ErrConflict = errors.New("audit: the replicated log moved on")

// Conflict is what a Replica's Append may return on a conflict: the
// commits the writer missed, from where its commit (or the first pending
// one) starts, read in the same round trip, so that it applies them and
// appends again without reading them (all, or the first of them).
type Conflict struct{ Commits []Commit }

func (c *Conflict) Error() string { return ErrConflict.Error() }
func (c *Conflict) Unwrap() error { return ErrConflict }

// DefaultReplicaTimeout bounds each call to the Replica.
const DefaultReplicaTimeout = 10 * time.Second

// maxConflicts bounds the catch-up-and-retry rounds of one commit: each
// round means another writer committed, so the log as a whole moved on.
const maxConflicts = 64

// maxReplicatedBatchBytes keeps a commit, with the pending ones it
// carries, within etcd's default request limit (1.5 MiB) with room for
// the transaction around them.
const maxReplicatedBatchBytes = 1 << 20

// DefaultReplicaInFlight is the writer's commits sent to the Replica and
// not yet answered: one. etcd's raft loop makes one round per fsync, and
// a commit sent while a round is on disk waits for that round and then
// its own, just as when it waits in this writer; two in flight on one box
// only added requests (p99 at 16 appenders 14.8 ms against 11.6 ms with
// one, alternating runs: docs/PERFORMANCE.md). Two may pay where the
// replica's round trip, not its disk, dominates.
const DefaultReplicaInFlight = 1

// DefaultGroupWait bounds the wait of a commit to the Replica for appends
// still arriving (pipeline.go, gather); groupGap ends it sooner when none
// comes. A closed loop of 16 appenders on a 3-member etcd otherwise splits
// into two groups that take turns, each append waiting for the other
// group's round and then its own: with the wait, one group, p99 7.8–9.7 →
// 4.8–6.5 ms and about twice the appends/s (docs/PERFORMANCE.md).
const (
	DefaultGroupWait = 500 * time.Microsecond
	groupGap         = 100 * time.Microsecond
)

// maxCarriedBytes bounds the entry bytes a commit carries for the pending
// ones: every byte of a request goes through the replica's consensus log,
// the alternatives not taken too. Pipelining pays when commits are small
// (appends wait on round trips); when the queue fills large commits, a
// second one waits for the first instead (measured: 256 appenders fell
// from 35,000 to 21,000–26,000 appends/s carrying every pending commit).
const maxCarriedBytes = 16 << 10

// Sync brings this copy up to the replicated log: it applies every commit
// other writers made since, and their checkpoints. Without a Replica it
// does nothing. The log's writer runs it, between its own commits.
func (l *Log) Sync(ctx context.Context) error { return l.sync(ctx, l.syncs) }

// Barrier returns once this copy holds every commit the Replica stored
// before the call: the read barrier of a replica's calls. The head is one
// linearizable read, shared by the calls waiting at that moment and made
// outside the writer; the commits come by the watch (Offer), or, past
// watchWait, by a catch-up.
func (l *Log) Barrier(ctx context.Context) error {
	if l.opts.Replica == nil {
		return nil
	}
	return l.barriers.Do(ctx, l.barrier)
}

// barrier is one round of Barrier.
func (l *Log) barrier() error {
	ctx, cancel := l.replicaCtx()
	defer cancel()
	size, err := l.opts.Replica.Head(ctx)
	if err == nil && l.Size() < size {
		wctx, wcancel := context.WithTimeout(ctx, watchWait)
		if l.WaitSize(wctx, size) != nil {
			err = l.SyncCommits(ctx)
		}
		wcancel()
	}
	if err != nil {
		return fmt.Errorf("%w: the read barrier: %w", ErrUnavailable, err)
	}
	return nil
}

// SyncCommits is Sync without the checkpoints: one read of the Replica
// when this copy is at its head. It is the read barrier of a replica's
// calls (store.Journal); the checkpoints come with the next Sync.
func (l *Log) SyncCommits(ctx context.Context) error { return l.sync(ctx, l.csyncs) }

func (l *Log) sync(ctx context.Context, to chan chan error) error {
	if l.opts.Replica == nil {
		return nil
	}
	done := make(chan error, 1)
	l.closeMu.RLock()
	if l.closed {
		l.closeMu.RUnlock()
		return ErrClosed
	}
	select {
	case to <- done:
	case <-ctx.Done():
		l.closeMu.RUnlock()
		return ctx.Err()
	}
	l.closeMu.RUnlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// replicaCtx is the context of one call to the Replica from the writer.
func (l *Log) replicaCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), l.opts.ReplicaTimeout)
}

// catchUp applies the replicated commits beyond this copy's tree, each
// checked to hash to the root the replica stored with it, then imports
// the checkpoints this copy lacks. Only the writer goroutine calls it.
func (l *Log) catchUp() error {
	ctx, cancel := l.replicaCtx()
	defer cancel()
	l.stmu.RLock()
	from := l.size
	l.stmu.RUnlock()
	err := l.replicaCommits(ctx, from, l.applyCommit)
	if err != nil {
		return fmt.Errorf("%w: catching up with the replicated log: %w", ErrUnavailable, err)
	}
	return l.importCheckpoints(ctx)
}

// applyConflict catches up after a lost race: with the commits the
// Replica answered with, or by reading them. The checkpoints wait for the
// next Sync: an append does not need them.
func (l *Log) applyConflict(err error) error {
	var c *Conflict
	if errors.As(err, &c) && len(c.Commits) > 0 {
		for _, cm := range c.Commits {
			l.stmu.RLock()
			size := l.size
			l.stmu.RUnlock()
			switch {
			case cm.End <= size:
				continue
			case cm.Start != size:
				return l.catchUp()
			}
			if err := l.applyCommit(cm); err != nil {
				return err
			}
		}
		return nil
	}
	return l.catchUp()
}

// applyCommit writes another writer's commit c into this copy.
func (l *Log) applyCommit(c Commit) error { return l.applyCommitChecked(c, nil) }

// applyCommitChecked is applyCommit with check, if set, approving the
// root this copy computes before anything is stored.
func (l *Log) applyCommitChecked(c Commit, check func(root [32]byte) error) error {
	l.stmu.RLock()
	start, rng := l.size, cloneRange(l.rng)
	l.stmu.RUnlock()
	if c.Start != start {
		return fmt.Errorf("%w: replicated commit at %d, this copy ends at %d", ErrCorrupt, c.Start, start)
	}
	if c.PrevRoot != rootOf(rng) {
		return fmt.Errorf("%w: replicated commit at %d does not extend this copy's tree (a fork)", ErrCorrupt, c.Start)
	}
	recs, err := splitRecords(c.Records)
	if err != nil || len(recs) == 0 || c.End != c.Start+uint64(len(recs)) {
		return fmt.Errorf("%w: replicated commit at %d: %d records for [%d, %d) (%v)", ErrCorrupt, c.Start, len(recs), c.Start, c.End, err)
	}
	props, err := fromRecords(c.Start, c.End, c.Changes)
	if err != nil {
		return err
	}
	batch := make([]*appendReq, len(recs))
	changes := map[uint64]*ChangeRef{} // by entry index
	for i, data := range recs {
		e, err := DecodeEntry(data)
		if err != nil {
			return fmt.Errorf("%w: replicated entry %d: %w", ErrCorrupt, c.Start+uint64(i), err)
		}
		if e.Change != nil {
			changes[c.Start+uint64(i)] = e.Change
		}
		batch[i] = &appendReq{data: bytes.Clone(data), leaf: LeafHash(data), keys: makeIndexKeys(&e), unixNano: e.Time.UnixNano()}
	}
	// Each payload is the one its entry commits to, and each entry that
	// records a change has its payload: checked before anything is
	// stored (the root covers the entries, not the payloads beside them).
	for _, p := range props {
		ref := changes[p.first]
		if ref == nil || ref.Revision != p.rev || ref.Digest != PayloadDigest(p.payload) {
			return fmt.Errorf("%w: replicated commit at %d: change %d is not the one entry %d records", ErrCorrupt, c.Start, p.rev, p.first)
		}
		delete(changes, p.first)
	}
	if len(changes) > 0 {
		return fmt.Errorf("%w: replicated commit at %d: %d entries record changes it does not carry", ErrCorrupt, c.Start, len(changes))
	}
	flush := l.flushDue(len(batch))
	l.dbmu.RLock()
	err = l.db.Update(func(tx *bolt.Tx) error {
		if err := l.writeBatch(tx, start, rng, batch, props, flush, nil); err != nil {
			return err
		}
		got := rootOf(rng)
		if got != c.Root {
			return fmt.Errorf("%w: replicated commit at %d hashes to %x, the replica says %x", ErrCorrupt, c.Start, got[:8], c.Root[:8])
		}
		if check != nil {
			return check(got)
		}
		return nil
	})
	l.dbmu.RUnlock()
	if err != nil {
		return err
	}
	l.advance(start, rng, batch, flush)
	l.stored(props)
	return nil
}

// AppendForwarder carries an append of a replica that does not lead to
// the one that does (forward.Client): Options.Forward. ForwardAppend
// appends the encoded entry there and returns its index; handled is false
// if this replica leads (it appends itself).
type AppendForwarder interface {
	ForwardAppend(ctx context.Context, data []byte) (index uint64, handled bool, err error)
}

// AppendEncoded appends an entry another replica encoded and forwarded
// (AppendForwarder): it is decoded and checked as Append checks its own,
// and appended as it is, so its leaf is the one the sender computed. It
// never forwards.
func (l *Log) AppendEncoded(ctx context.Context, data []byte) (uint64, error) {
	e, err := DecodeEntry(data)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInvalidEntry, err)
	}
	if e.Change != nil {
		return 0, fmt.Errorf("%w: an appended entry carries no change (Propose records changes)", ErrInvalidEntry)
	}
	if again, err := e.Encode(); err != nil {
		return 0, err
	} else if !bytes.Equal(again, data) {
		return 0, fmt.Errorf("%w: a forwarded entry is not in its canonical encoding", ErrInvalidEntry)
	}
	if err := e.Validate(); err != nil {
		return 0, err
	}
	idx, _, err := l.appendData(ctx, data, &e, ctx.Value(conditionKey{}))
	return idx, err
}

// syncTo waits until this copy holds size entries: the watch brings the
// leader's commit within a round trip; past watchWait, catch-ups read it
// (a few more ride out a Replica member that lags).
func (l *Log) syncTo(ctx context.Context, size uint64) error {
	wctx, cancel := context.WithTimeout(ctx, watchWait)
	err := l.WaitSize(wctx, size)
	cancel()
	if err == nil {
		return nil
	}
	for range 20 {
		if l.Size() >= size {
			return nil
		}
		if err := l.Sync(ctx); err != nil {
			return err
		}
	}
	if l.Size() >= size {
		return nil
	}
	return fmt.Errorf("%w: the leader appended entry %d, and this copy ends at %d", ErrUnavailable, size-1, l.Size())
}

// watchWait bounds the wait for a watch to bring the leader's commit to
// this copy before it reads the commit itself.
const watchWait = 100 * time.Millisecond

// LostCompares counts this copy's commits the Replica refused because the
// replicated tree had moved: another writer appended first. With every
// write sequenced by the term's leader it stays at zero outside a
// failover; it is what the one-writer design is checked by.
func (l *Log) LostCompares() uint64 { return l.lost.Load() }

// Queued is how many appends and proposals wait for the writer: the
// depth of the queue in front of the log.
func (l *Log) Queued() int { return len(l.reqs) }

func (l *Log) countLost(err error) error {
	if errors.Is(err, ErrConflict) {
		l.lost.Add(1)
	}
	return err
}

// Offer hands this copy commits a watch of the Replica delivered (the
// leader's, with their payloads): the writer applies those that continue
// its tree, each checked as a catch-up checks it, without reading them
// again; a gap (a watch that lagged) is filled by a catch-up. It does not
// block: commits offered while the writer is busy are dropped, and the
// next Sync or offer brings them.
func (l *Log) Offer(commits []Commit) {
	if l.opts.Replica == nil || len(commits) == 0 {
		return
	}
	select {
	case l.offers <- commits:
	default:
		select { // busy: a catch-up with the next one applies them
		case l.offers <- nil:
		default:
		}
	}
}

// applyOffered applies offered commits in the writer (no commit of its
// own in flight). nil: some were dropped; catch up.
func (l *Log) applyOffered(cs []Commit) {
	if cs == nil {
		if err := l.catchUpCommits(); err != nil {
			l.logErr("catching up after a watch", err)
		}
		return
	}
	// Offers queued meanwhile join these: the contiguous commits are
	// written as one transaction of this copy, one fsync for all.
	for more := true; more; {
		select {
		case next := <-l.offers:
			if next == nil {
				l.applyOffered(cs)
				l.applyOffered(nil)
				return
			}
			cs = append(cs, next...)
		default:
			more = false
		}
	}
	size := l.Size()
	var run []Commit // contiguous, from size on
	for _, c := range cs {
		switch {
		case c.End <= size:
			continue // this copy has it: its own, or applied before
		case c.Start != size:
			if err := l.applyRun(run); err != nil {
				return
			}
			if err := l.catchUpCommits(); err != nil {
				l.logErr("catching up after a gap in the watch", err)
			}
			return
		}
		run = append(run, c)
		size = c.End
	}
	_ = l.applyRun(run)
}

// maxRunBytes bounds the entries and payloads of watched commits written
// in one transaction.
const maxRunBytes = 4 << 20

// applyRun applies contiguous commits, as few transactions as their
// size allows: one commit spanning them, its entries checked against the
// last one's root (which covers all) and each payload against its entry.
func (l *Log) applyRun(run []Commit) error {
	for len(run) > 0 {
		c, n, held := run[0], 1, len(run[0].Records)
		for ; n < len(run) && held+len(run[n].Records) <= maxRunBytes; n++ {
			if n == 1 {
				c.Records = append([]byte(nil), c.Records...)
				c.Changes = append([]ChangeRecord(nil), c.Changes...)
			}
			next := run[n]
			c.Records = append(c.Records, next.Records...)
			c.Changes = append(c.Changes, next.Changes...)
			c.End, c.Root = next.End, next.Root
			held += len(next.Records)
			for _, ch := range next.Changes {
				held += len(ch.Payload)
			}
		}
		if err := l.applyCommit(c); err != nil {
			l.logErr("applying a watched commit", err)
			return err
		}
		run = run[n:]
	}
	return nil
}

// catchUpCommits is catchUp without the checkpoints (a watch brings
// those): the commits beyond this copy's tree.
func (l *Log) catchUpCommits() error {
	ctx, cancel := l.replicaCtx()
	defer cancel()
	err := l.replicaCommits(ctx, l.Size(), l.applyCommit)
	if err != nil {
		return fmt.Errorf("%w: catching up with the replicated log: %w", ErrUnavailable, err)
	}
	return nil
}

// logErr reports a failure of the writer's background work; a later Sync
// retries it and answers its caller with it.
func (l *Log) logErr(what string, err error) {
	if l.opts.OnError != nil {
		l.opts.OnError(fmt.Errorf("audit: %s: %w", what, err))
	}
}

// WaitSize waits until this copy holds size entries (another replica's
// commit reaching it, by a watch or a catch-up), or ctx ends.
func (l *Log) WaitSize(ctx context.Context, size uint64) error {
	for {
		l.stmu.RLock()
		have, grew := l.size, l.grew
		l.stmu.RUnlock()
		if have >= size {
			return nil
		}
		select {
		case <-grew:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ChangesNotify is signalled (without blocking: one signal may stand for
// many) after a commit that carried changes reached this copy: the
// leader's own, or one another replica sequenced. A store projecting
// the log (store.Journal) reads the changes after its revision then.
func (l *Log) ChangesNotify() <-chan struct{} { return l.changed }

// noteChanges signals ChangesNotify if a commit carried n > 0 changes.
func (l *Log) noteChanges(n int) {
	if n == 0 {
		return
	}
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// importCheckpoints stores the replicated checkpoints beyond this copy's
// latest whose tree this copy holds, each checked against the root this
// copy computes at its size, with the key that signed it.
func (l *Log) importCheckpoints(ctx context.Context) error {
	l.cpMu.Lock()
	defer l.cpMu.Unlock()
	var after uint64
	if l.latest != nil {
		after = l.latest.Size
	}
	cps, err := l.opts.Replica.Checkpoints(ctx, after)
	if err != nil {
		return fmt.Errorf("%w: replicated checkpoints: %w", ErrUnavailable, err)
	}
	for _, rc := range cps {
		cp, err := ParseCheckpoint(rc.Note)
		if err != nil {
			return fmt.Errorf("%w: replicated checkpoint: %w", ErrCorrupt, err)
		}
		if cp.Size > l.Size() || cp.Origin != l.origin {
			continue // beyond this copy (a commit since), or another log's
		}
		root, err := l.RootAt(ctx, cp.Size)
		if err != nil {
			return err
		}
		if root != cp.Hash {
			return &InconsistentError{OldSize: cp.Size, NewSize: cp.Size, OldRoot: cp.Hash, NewRoot: root,
				Err: errors.New("a replicated checkpoint signs another tree than this copy's")}
		}
		if err := l.storeCheckpoint(cp.Size, rc.Note, rc.KeyVersion, rc.KeyPEM); err != nil {
			return err
		}
		cp.Note = bytes.Clone(rc.Note)
		l.latest = &cp
	}
	return nil
}

// storeCheckpoint keeps a signed checkpoint and the record of the key
// that signed it.
func (l *Log) storeCheckpoint(size uint64, msg []byte, keyVersion uint64, pemb []byte) error {
	pub, err := attest.ParsePublicKeyPEM(pemb, keyVersion)
	if err != nil {
		return fmt.Errorf("%w: the key of the checkpoint of size %d: %w", ErrCorrupt, size, err)
	}
	err = l.update(func(tx *bolt.Tx) error {
		keys := tx.Bucket(bucketKeys)
		id := []byte(pub.KeyID())
		if keys.Get(id) == nil {
			rec := binary.BigEndian.AppendUint64(nil, keyVersion)
			rec = binary.BigEndian.AppendUint64(rec, size) // first tree size signed
			if err := keys.Put(id, append(rec, pemb...)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketCheckpoints).Put(u64(size), msg)
	})
	if err != nil {
		return fmt.Errorf("%w: store checkpoint: %w", ErrUnavailable, err)
	}
	return nil
}
