package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
)

// Journal is the ordered, durable log a store
// sequences its changes in (the audit log: audit.Log). Each write is a
// proposal: the journal's writer runs the write's rules in log order,
// and appends its entries and its change (the keys it wrote) in one
// commit, the write's only durable round. The store's file is then a
// projection of the journal, checkpointed with the revision it reflects:
// Open replays the changes after it.
type Journal interface {
	Propose(ctx context.Context, p audit.Proposal) (uint64, error)
	Changes(ctx context.Context, from uint64, fn func(rev, index uint64, payload []byte) error) error
	LastChange() (uint64, error)
	// Snapshot reads the newest whole state the changes start from.
	Snapshot(fn func(rev, index uint64, payload []byte) error) (bool, error)
	// SyncCommits brings the journal's copy up to the replicated journal (a
	// read barrier); ChangesNotify is signalled when changes reached the
	// copy. A journal without replicas does nothing on Sync.
	SyncCommits(ctx context.Context) error
	// Barrier returns once the copy holds every change the replicated
	// journal held when it was called (the read barrier of every call).
	Barrier(ctx context.Context) error
	ChangesNotify() <-chan struct{}
}

// Defaults of the journal's checkpoints.
const (
	// DefaultCheckpointInterval bounds how long the file lags the
	// journal: what a restart replays.
	DefaultCheckpointInterval = time.Second
	// checkpointChanges checkpoints sooner under load: the open
	// transaction's dirty pages stay bounded.
	checkpointChanges = 1024
)

// journalState is a journaled store's write side, guarded by DB.writeMu.
type journalState struct {
	// open is the write transaction the changes since the last
	// checkpoint are written in; nil: none open.
	open *bolt.Tx
	// next is the revision of the last change prepared: ahead of the
	// model's by the changes prepared and not yet durable.
	next uint64
	// inflight are the ops of the changes prepared and not yet durable,
	// in order: later changes' rules see them (txn.ops).
	inflight []*proposal
	readers  int        // views waiting for the in-flight changes
	cond     *sync.Cond // on writeMu: inflight or readers changed
	dirty    int        // changes since the checkpoint
	behind   bool       // a checkpoint failed: the file lacks changes the model has
	since    time.Time  // of the checkpoint
	interval time.Duration
	failed   error // sticky: the file could not be kept; writes fail closed
	stop     chan struct{}
	stopped  chan struct{}
	// projected closes when the projector (a forwarding replica's) ends.
	projected chan struct{}
}

// proposal is one write of a journaled store, as the journal's writer
// prepares and settles it (audit.Proposal).
type proposal struct {
	db      *DB
	fn      func(*txn) error
	entries []audit.Entry // the caller's; none: a state_change entry
	tx      *txn
	seed    int // tx.ops[:seed] are earlier in-flight changes'
	rev     uint64
	// own is how many entries the change made itself (tx.entries),
	// ahead of the caller's: the caller's first is at first+own.
	own int
	// call: entries are the call's record (CallRecord), which a write
	// that changes nothing leaves to the call to append.
	call bool
}

// Journaled reports whether the store sequences its writes in a Journal,
// so that a write can carry its entries (OpenGrant).
func (db *DB) Journaled() bool { return db.journal != nil }

// propose runs fn as one change sequenced by the journal, with entries
// (none: the call's record, if ctx carries one no write took yet, or
// else a state_change entry describing it). It returns once the change
// is durable and applied to the model, or fn's error, or why the journal
// did not take it (nothing changed).
func (db *DB) propose(ctx context.Context, entries []audit.Entry, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pctx := ctx
	var term context.Context
	if db.lead.forward != nil {
		// A replicated journal takes the leader's proposals only, each
		// under its term's fence.
		var ok bool
		if term, ok = db.leading(); !ok {
			return ErrNotLeader
		}
		pctx = audit.WithCondition(ctx, audit.ConditionOf(term))
	}
	entries, rec := callEntries(ctx, entries)
	p := &proposal{db: db, fn: fn, entries: entries, call: rec != nil}
	if req, ok := ctx.Value(requestKey{}).(*requestID); ok {
		p.fn = func(tx *txn) error {
			if !req.noted && tx.Bucket(bucketRequests).Get([]byte(req.id)) != nil {
				return errAppliedBefore()
			}
			before := len(tx.writes)
			if err := fn(tx); err != nil || len(tx.writes) == before {
				return err // a write that changed nothing records nothing
			}
			req.noted = true
			return noteRequest(tx, req.id, db.now())
		}
	}
	first, err := db.journal.Propose(pctx, p)
	if errors.Is(err, audit.ErrFenced) {
		// Another replica leads: this one's term is over whatever its
		// context says (it was paused past its lease). It follows.
		db.resign(term)
	}
	if errors.Is(err, errNoChange) {
		err = nil // nothing to record: not a revision, not an entry
	}
	if rec != nil {
		rec.settle(first+uint64(p.own), err == nil && p.rev != 0)
	}
	return err
}

// errNoChange is Prepare's answer to a write that wrote nothing and has
// no entry of its own: propose reports it as done.
var errNoChange = errors.New("store: the write changed nothing")

// Prepare runs the write's rules in the open transaction, on top of every
// change before it, and returns its entries and change.
func (p *proposal) Prepare(first uint64) (audit.Prepared, error) {
	db := p.db
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	j := &db.jr
	for j.readers > 0 && len(j.inflight) == 0 {
		j.cond.Wait()
	}
	if j.failed != nil {
		return audit.Prepared{}, j.failed
	}
	if db.lead.forward != nil && len(j.inflight) == 0 {
		// A change the log's copy holds and the model does not yet (a
		// commit whose answer failed while etcd took it, brought back by
		// the watch) is applied before anything is prepared on top: a
		// revision is never prepared twice. (It may checkpoint: the open
		// transaction is taken after it.)
		if err := db.projectLocked(); err != nil {
			return audit.Prepared{}, err
		}
	}
	if err := db.ensureOpenLocked(); err != nil {
		return audit.Prepared{}, err
	}
	tx := &txn{Tx: j.open, model: &db.model, first: first, undo: true}
	for _, q := range j.inflight {
		tx.ops = append(tx.ops, q.tx.ops[q.seed:]...)
	}
	p.seed = len(tx.ops)
	if err := p.fn(tx); err != nil {
		if uerr := tx.rollback(); uerr != nil {
			db.failLocked(fmt.Errorf("store: a refused change could not be undone: %w", uerr))
		}
		return audit.Prepared{}, err
	}
	if len(tx.writes) == 0 && len(tx.entries) == 0 && (len(p.entries) == 0 || p.call) {
		// No revision for nothing; a call's record is appended by the
		// call (the gateway's auditWithChange), without a change.
		if uerr := tx.rollback(); uerr != nil {
			db.failLocked(fmt.Errorf("store: a change of nothing could not be undone: %w", uerr))
		}
		return audit.Prepared{}, errNoChange
	}
	p.tx, p.rev, p.own = tx, j.next+1, len(tx.entries)
	j.next = p.rev
	j.inflight = append(j.inflight, p)
	// The change's own entries (an opening's, built in the commit) come
	// first: the first records the change. Then the caller's.
	entries := append(tx.entries, p.entries...)
	if len(entries) == 0 {
		entries = []audit.Entry{stateChangeEntry(tx.ops[p.seed:])}
	}
	return audit.Prepared{Entries: entries, Revision: p.rev, Payload: EncodeWrites(nil, tx.writes)}, nil
}

// Done applies the change to the model once it is durable, or undoes it
// with every change prepared on top of it (they cannot be durable
// without it; their own Done then finds nothing to undo).
func (p *proposal) Done(err error) {
	db := p.db
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	j := &db.jr
	defer j.cond.Broadcast()
	if err != nil {
		k := slices.Index(j.inflight, p)
		if k < 0 {
			return // undone with a change it was prepared on
		}
		for i := len(j.inflight) - 1; i >= k; i-- {
			if uerr := j.inflight[i].tx.rollback(); uerr != nil {
				db.failLocked(fmt.Errorf("store: a change the journal did not take could not be undone: %w", uerr))
			}
		}
		j.inflight = j.inflight[:k]
		j.next = p.rev - 1
		return
	}
	if len(j.inflight) == 0 || j.inflight[0] != p {
		// Durable, yet undone or out of order: the model can no longer
		// follow the journal. Fail closed; a restart replays it.
		db.failLocked(fmt.Errorf("store: change %d was reported durable out of order", p.rev))
		return
	}
	j.inflight = j.inflight[1:]
	db.model.apply(change{revision: p.rev, ops: p.tx.ops[p.seed:]})
	j.dirty++
	if len(j.inflight) == 0 && (j.dirty >= checkpointChanges || time.Since(j.since) >= j.interval) {
		db.checkpointLocked()
	}
}

// DrainFirst says whether the writer should store the changes in flight
// before preparing this one (audit.Drainer): a checkpoint is due, or
// readers wait for a moment with nothing in flight. Chained commits
// would otherwise keep one in flight for as long as the load lasts.
func (p *proposal) DrainFirst() bool {
	db := p.db
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	j := &db.jr
	if len(j.inflight) == 0 {
		return false
	}
	return j.readers > 0 || j.dirty >= checkpointChanges || time.Since(j.since) >= j.interval
}

// ensureOpenLocked begins the transaction the next changes are written
// in.
func (db *DB) ensureOpenLocked() error {
	if db.jr.open != nil {
		return nil
	}
	btx, err := db.bolt.Begin(true)
	if err != nil {
		return beginError(err)
	}
	db.jr.open = btx
	if db.jr.behind {
		// A checkpoint failed: the file lacks durable changes the model
		// has. They are written again from the journal first.
		if err := db.refillLocked(); err != nil {
			_ = btx.Rollback()
			db.jr.open = nil
			return fmt.Errorf("store: the file lacks changes after a failed checkpoint, and the journal did not give them: %w", err)
		}
		db.jr.behind = false
	}
	return nil
}

// refillLocked writes into the open transaction the changes between the
// file's revision and the model's, from the journal, each in order and
// checked (Journal.Changes checks each against its entry). The model has
// them already.
func (db *DB) refillLocked() error {
	var rev uint64
	if v := db.jr.open.Bucket(bucketMeta).Get(metaRevision); len(v) == 8 {
		rev = binary.BigEndian.Uint64(v)
	}
	want, next := db.model.rev.Load(), rev+1
	err := db.journal.Changes(context.Background(), rev, func(r, _ uint64, payload []byte) error {
		if r > want {
			return errReplayDone
		}
		if r != next {
			return fmt.Errorf("%w: change %d where %d was due", ErrJournal, r, next)
		}
		ws, err := DecodeWrites(bytes.Clone(payload))
		if err != nil {
			return fmt.Errorf("%w: change %d: %w", ErrJournal, r, err)
		}
		for _, w := range ws {
			if err := writeRaw(db.jr.open, w); err != nil {
				return fmt.Errorf("%w: change %d: %w", ErrJournal, r, err)
			}
		}
		next++
		db.jr.dirty++
		return nil
	})
	if errors.Is(err, errReplayDone) {
		err = nil
	}
	if err == nil && next != want+1 {
		err = fmt.Errorf("%w: the journal's changes end at %d, the store is at %d", ErrJournal, next-1, want)
	}
	return err
}

var errReplayDone = errors.New("store: replay reached the model")

// checkpointLocked commits the open transaction, with the model's
// revision, and fsyncs it: what a restart starts its replay from. Only
// durable changes are in it (no change is in flight). A failed commit
// loses the transaction: the file is refilled from the journal before
// it is used again.
func (db *DB) checkpointLocked() {
	j := &db.jr
	j.since = time.Now()
	if j.open == nil || j.dirty == 0 {
		return
	}
	btx := j.open
	j.open, j.dirty = nil, 0
	err := btx.Bucket(bucketMeta).Put(metaRevision, binary.BigEndian.AppendUint64(nil, db.model.rev.Load()))
	if err == nil {
		err = btx.Commit()
	} else {
		_ = btx.Rollback()
	}
	if err != nil {
		// The transaction is gone and the handle may be too: writes fail
		// closed until a restart, which replays from the last checkpoint.
		// The transaction is gone (bbolt rolled it back); the file is at
		// the checkpoint before. The next write or read refills it from
		// the journal (a disk that filled up and emptied again recovers
		// without a restart; the journal's own commits fail meanwhile).
		db.jr.behind = true
	}
}

// checkpointDueLocked checkpoints in the middle of a replay or a
// projection once checkpointChanges changes are open. A long journal
// replayed in one transaction (a new replica, a full replay) would hold
// every page it dirtied in memory: 5.3 GB of a process at a million
// grants, with bbolt's nodes grown far past a page, so that every insert
// moved kilobytes.
func (db *DB) checkpointDueLocked() error {
	if db.jr.dirty < checkpointChanges {
		return nil
	}
	db.checkpointLocked()
	if db.jr.behind {
		return errCheckpoint
	}
	return db.ensureOpenLocked()
}

// errCheckpoint stops a replay whose checkpoint failed (a full disk).
var errCheckpoint = errors.New("store: a checkpoint failed during the replay; the file is at the one before")

// failLocked makes every later write fail closed with err.
func (db *DB) failLocked(err error) {
	if db.jr.failed == nil {
		db.jr.failed = err
	}
	// A store that cannot sequence must not hold the term: another
	// replica's election is the way out (its writes are forwarded there).
	db.lead.mu.Lock()
	db.lead.term = nil
	db.lead.mu.Unlock()
	if db.jr.open != nil {
		_ = db.jr.open.Rollback()
		db.jr.open = nil
	}
}

// viewJournaled runs fn in the open transaction once no change is in
// flight: it sees every durable change and nothing else.
func (db *DB) viewJournaled(fn func(*bolt.Tx) error) error {
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	j := &db.jr
	j.readers++
	for len(j.inflight) > 0 {
		j.cond.Wait()
	}
	j.readers--
	j.cond.Broadcast()
	if j.failed != nil {
		return j.failed
	}
	if err := db.ensureOpenLocked(); err != nil {
		return err
	}
	return fn(j.open)
}

// viewInFlight runs fn in the open transaction as it is, with the changes
// in flight (which may yet be undone): for a check that must not wait for
// a moment with nothing in flight.
func (db *DB) viewInFlight(fn func(*bolt.Tx) error) error {
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	if db.jr.failed != nil {
		return db.jr.failed
	}
	if err := db.ensureOpenLocked(); err != nil {
		return err
	}
	return fn(db.jr.open)
}

// openJournal replays the journal's changes after the file's revision
// into the file and the model, checkpoints, and starts the idle
// checkpoints.
func (db *DB) openJournal(j Journal, interval time.Duration) error {
	db.journal = j
	db.jr.cond = sync.NewCond(&db.writeMu)
	db.jr.interval = interval
	db.jr.since = time.Now()
	replicated := db.lead.forward != nil
	if replicated {
		// The copy of a replicated journal is written without fsync: it
		// may be behind this file after a crash. It catches up first.
		ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
		err := j.SyncCommits(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("store: catching up with the replicated journal: %w", err)
		}
	}
	rev := db.model.rev.Load()
	last, err := j.LastChange()
	if err != nil {
		return err
	}
	if last != 0 && last < rev {
		return fmt.Errorf("%w: the store is at revision %d and the journal's changes end at %d: the journal is older than the store", ErrJournal, rev, last)
	}
	var snapRev uint64
	if _, err := j.Snapshot(func(r, _ uint64, _ []byte) error { snapRev = r; return nil }); err != nil {
		return err
	}
	if rev > 0 && last == 0 && !replicated {
		// A store older than its journal's changes (a gateway that
		// recorded none before): its state is the genesis they start
		// from, recorded once, so that a replay from nothing reaches it.
		switch {
		case snapRev == 0:
			if err := db.recordGenesis(context.Background(), j, rev); err != nil {
				return fmt.Errorf("%w: recording the genesis snapshot: %w", ErrJournal, err)
			}
		case snapRev != rev:
			return fmt.Errorf("%w: the store is at revision %d and the journal's snapshot at %d, with no changes", ErrJournal, rev, snapRev)
		}
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	if err := db.ensureOpenLocked(); err != nil {
		return err
	}
	if rev == 0 && snapRev > 0 {
		// A new store replays from the genesis.
		if _, err := j.Snapshot(func(r, _ uint64, payload []byte) error { return db.applyReplayed(r, payload) }); err != nil {
			db.failLocked(err)
			return err
		}
		rev = snapRev
	}
	err = j.Changes(context.Background(), rev, func(r, _ uint64, payload []byte) error {
		if r != db.model.rev.Load()+1 {
			return fmt.Errorf("%w: change %d where %d was due", ErrJournal, r, db.model.rev.Load()+1)
		}
		if err := db.applyReplayed(r, payload); err != nil {
			return err
		}
		return db.checkpointDueLocked()
	})
	if err != nil {
		db.failLocked(err)
		return err
	}
	db.jr.next = db.model.rev.Load()
	db.checkpointLocked()
	if db.jr.failed != nil {
		return db.jr.failed
	}
	db.jr.stop, db.jr.stopped = make(chan struct{}), make(chan struct{})
	go db.idleCheckpoints(db.jr.stop, db.jr.stopped)
	if replicated {
		db.jr.projected = make(chan struct{})
		go db.projector(j.ChangesNotify(), db.jr.stop, db.jr.projected)
	}
	return nil
}

// project applies the journal's changes this replica did not sequence,
// as they reach its copy: the leader's, on a follower (and any left by a
// former term when it leads). A change this replica sequences is applied
// by its Done; it is skipped while in flight.
func (db *DB) projectLocked() error {
	j := &db.jr
	if len(j.inflight) > 0 {
		return nil
	}
	if j.failed != nil {
		return j.failed
	}
	if err := db.ensureOpenLocked(); err != nil {
		return err
	}
	err := db.journal.Changes(context.Background(), db.model.rev.Load(), func(r, _ uint64, payload []byte) error {
		if want := db.model.rev.Load() + 1; r != want {
			// Changes that do not follow this copy: a snapshot they
			// start from (a genesis recorded after this copy opened).
			if err := db.loadSnapshotLocked(r - 1); err != nil {
				return fmt.Errorf("%w: change %d where %d was due: %w", ErrJournal, r, want, err)
			}
		}
		if err := db.applyProjected(r, payload); err != nil {
			return err
		}
		return db.checkpointDueLocked()
	})
	if errors.Is(err, errCheckpoint) {
		// The file is at the checkpoint before; the next run refills it
		// (ensureOpenLocked) and goes on.
		return nil
	}
	if err != nil {
		db.failLocked(err)
		return err
	}
	j.next = db.model.rev.Load()
	if db.lead.forward != nil {
		db.advance()
	}
	if j.dirty >= checkpointChanges || time.Since(j.since) >= j.interval {
		db.checkpointLocked()
	}
	return nil
}

// loadSnapshotLocked replaces this copy's state with the journal's
// snapshot, which must be at revision rev: every bucket emptied and
// refilled in the open transaction, the model loaded again, and the
// hooks told that every target may have changed.
func (db *DB) loadSnapshotLocked(rev uint64) error {
	var payload []byte
	found, err := db.journal.Snapshot(func(r, _ uint64, p []byte) error {
		if r != rev {
			return fmt.Errorf("the snapshot is at revision %d", r)
		}
		payload = bytes.Clone(p)
		return nil
	})
	if err != nil {
		return err
	}
	if !found {
		return errors.New("no snapshot")
	}
	ws, err := DecodeWrites(payload)
	if err != nil {
		return err
	}
	btx := db.jr.open
	if err := emptyRecords(btx); err != nil {
		return err
	}
	for _, w := range ws {
		if w.Delete {
			return errors.New("a snapshot deletes a key")
		}
		if err := writeRaw(btx, w); err != nil {
			return err
		}
	}
	if err := btx.Bucket(bucketMeta).Put(metaRevision, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
		return err
	}
	recs, _, err := load(btx)
	if err != nil {
		return err
	}
	if db.applied != nil {
		var targets []string
		for id := range recs.targets {
			targets = append(targets, id)
		}
		slices.Sort(targets)
		db.applied(rev, targets, nil)
	}
	db.model.replace(recs, rev)
	db.jr.dirty++
	return nil
}

// applyProjected is applyReplayed for a change another replica
// sequenced: the hooks hear of it before the revision moves (Applied,
// Revoked), as for a change of the replicated store.
func (db *DB) applyProjected(r uint64, payload []byte) error {
	if db.applied == nil && db.revoked == nil {
		return db.applyReplayed(r, payload)
	}
	return db.applyReplayedHooked(r, payload, func(ops []op) {
		if db.applied != nil {
			targets, subsystems := touched(ops)
			db.applied(r, targets, subsystems)
		}
		if db.revoked != nil {
			if scopes := revokedScopes(ops); len(scopes) > 0 {
				db.revoked(scopes)
			}
		}
	})
}

// projector runs projectLocked whenever the journal signals changes.
func (db *DB) projector(notify <-chan struct{}, stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	for {
		select {
		case <-stop:
			return
		case <-notify:
		}
		db.writeMu.Lock()
		_ = db.projectLocked() // a failure fails the store closed (failLocked)
		db.writeMu.Unlock()
	}
}

// applyReplayed writes a change (or a snapshot) read from the journal into
// the open transaction and the model, as revision r.
func (db *DB) applyReplayed(r uint64, payload []byte) error {
	return db.applyReplayedHooked(r, payload, nil)
}

// applyReplayedHooked is applyReplayed calling hook with the change's ops
// before the model (and its revision) moves.
func (db *DB) applyReplayedHooked(r uint64, payload []byte, hook func([]op)) error {
	ws, err := DecodeWrites(bytes.Clone(payload))
	if err != nil {
		return fmt.Errorf("%w: revision %d: %w", ErrJournal, r, err)
	}
	var ops []op
	for _, w := range ws {
		o, err := db.opOf(db.jr.open, w)
		if err != nil {
			return fmt.Errorf("%w: revision %d: %w", ErrJournal, r, err)
		}
		if o != nil {
			ops = append(ops, *o)
		}
		if err := writeRaw(db.jr.open, w); err != nil {
			return fmt.Errorf("%w: revision %d: %w", ErrJournal, r, err)
		}
	}
	if hook != nil {
		hook(ops)
	}
	db.model.apply(change{revision: r, ops: ops})
	db.jr.dirty++
	return nil
}

// recordGenesis records the store's whole state, at revision rev, as the
// journal's snapshot.
func (db *DB) recordGenesis(ctx context.Context, j Journal, rev uint64) error {
	var payload []byte
	err := db.bolt.View(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if bytes.Equal(name, bucketMeta) {
				continue
			}
			if err := tx.Bucket(name).ForEach(func(k, v []byte) error {
				payload = EncodeWrites(payload, []Write{{Bucket: name, Key: k, Value: v}})
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	_, err = j.Propose(ctx, genesis{rev: rev, payload: payload})
	return err
}

// genesis is the proposal of a store's whole state as the journal's
// snapshot: it changes nothing.
type genesis struct {
	rev     uint64
	payload []byte
}

func (g genesis) Prepare(uint64) (audit.Prepared, error) {
	e := audit.Entry{Kind: audit.EventStateSnapshot,
		Detail: fmt.Sprintf("the store's state at revision %d: the genesis its later changes are recorded from", g.rev)}
	return audit.Prepared{Entries: []audit.Entry{e}, Revision: g.rev, Payload: g.payload, Snapshot: true}, nil
}

func (genesis) Done(error) {}

// ErrJournal is what Open wraps when the journal and the store's file do
// not fit together.
var ErrJournal = errors.New("store: the journal does not continue the store")

// idleCheckpoints checkpoints changes left when the writes stop.
func (db *DB) idleCheckpoints(stop <-chan struct{}, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTicker(db.jr.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		db.writeMu.Lock()
		if len(db.jr.inflight) == 0 && time.Since(db.jr.since) >= db.jr.interval {
			db.checkpointLocked()
		}
		db.writeMu.Unlock()
	}
}

// closeJournal stops the idle checkpoints and checkpoints what is left.
func (db *DB) closeJournal() {
	db.writeMu.Lock()
	stop := db.jr.stop
	db.jr.stop = nil
	db.writeMu.Unlock()
	if stop == nil {
		return // closed before
	}
	close(stop)
	<-db.jr.stopped
	if db.jr.projected != nil {
		<-db.jr.projected
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	for len(db.jr.inflight) > 0 {
		db.jr.cond.Wait()
	}
	db.checkpointLocked()
	// Writes from now on fail (a proposal the log still holds must not
	// open a transaction that would keep the file from closing).
	db.failLocked(ErrClosed)
}

// writeRaw writes w into btx as it is: a replayed change.
func writeRaw(btx *bolt.Tx, w Write) error {
	if !replicatedBuckets[string(w.Bucket)] || bytes.Equal(w.Bucket, bucketMeta) {
		return fmt.Errorf("a change writes bucket %q", w.Bucket)
	}
	b := btx.Bucket(w.Bucket)
	if w.Delete {
		return b.Delete(w.Key)
	}
	return b.Put(w.Key, w.Value)
}

// undoRec is a key as it was before a journaled change wrote it.
type undoRec struct {
	bucket, key, old []byte
	existed          bool
}

// noteUndo remembers k of bucket name as it is, before a write.
func (tx *txn) noteUndo(name, k []byte) {
	old := tx.Bucket(name).Get(k)
	tx.undoLog = append(tx.undoLog, undoRec{bucket: name, key: bytes.Clone(k), old: bytes.Clone(old), existed: old != nil})
}

// rollback puts back every key the transaction's change wrote, newest
// first: the open transaction is as before the change.
func (tx *txn) rollback() error {
	for i := len(tx.undoLog) - 1; i >= 0; i-- {
		u := tx.undoLog[i]
		b := tx.Bucket(u.bucket)
		var err error
		if u.existed {
			err = b.Put(u.key, u.old)
		} else {
			err = b.Delete(u.key)
		}
		if err != nil {
			return err
		}
	}
	tx.undoLog = nil
	return nil
}

// stateChangeEntry is the entry of a change no caller's entry stands
// for: what it wrote, by record.
func stateChangeEntry(ops []op) audit.Entry {
	var parts []string
	e := audit.Entry{Kind: audit.EventStateChange}
	for _, o := range ops {
		verb := "stored"
		if o.del {
			verb = "removed"
		}
		switch {
		case o.target != nil:
			parts = append(parts, "target "+o.target.ID+" "+verb)
		case o.subsystem != nil:
			parts = append(parts, "subsystem "+o.subsystem.NQN+" "+verb)
		case o.namespace != nil:
			parts = append(parts, fmt.Sprintf("namespace %s/%d %s", o.namespace.SubsystemNQN, o.namespace.NSID, verb))
		case o.binding != nil:
			parts = append(parts, "host binding "+o.binding.SPIFFEID+" "+verb)
		case o.job != nil:
			parts = append(parts, "job "+o.job.ID+" "+o.job.State)
			e.JobID = o.job.ID
		case o.root != nil:
			parts = append(parts, fmt.Sprintf("access root of %s at version %d (fingerprint %s)", o.root.Scope, o.root.Version, o.root.Fingerprint))
		case o.policy != nil:
			parts = append(parts, "policy "+o.policy.Digest+" in force")
		case o.grant != nil:
			g := o.grant
			s := "grant " + g.ID + " " + g.State
			if g.RemovalPending {
				s += " (removal pending)"
			}
			parts = append(parts, s)
			if len(ops) == 1 {
				e.GrantID, e.JobID, e.Tenant = g.ID, g.JobID, g.Tenant
			}
		}
	}
	const most = 8
	if len(parts) > most {
		parts = append(parts[:most:most], fmt.Sprintf("and %d more", len(parts)-most))
	}
	if len(parts) == 0 {
		parts = []string{"indexes only"}
	}
	e.Detail = strings.Join(slices.Clip(parts), "; ")
	if nvmegate.LooksLikeKeyMaterial(e.Detail) {
		e.Detail = "a state change"
	}
	return e
}
