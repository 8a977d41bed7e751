package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
)

// SchemaVersion is the version of the bucket layout and record encoding that
// this package writes. Open upgrades older files (there are none yet) and
// refuses newer ones with ErrSchemaTooNew.
const SchemaVersion = 1

// storeKind marks a file as an nvmegate store, so that Open refuses the audit
// log or the key store (also bbolt, also with a meta bucket) by mistake.
const storeKind = "nvmegate/store"

// Bucket names; doc.go describes the keys and values of each.
var (
	bucketMeta               = []byte("meta")
	bucketTargets            = []byte("targets")
	bucketSubsystems         = []byte("subsystems")
	bucketSubsystemsByTarget = []byte("subsystems_by_target")
	bucketNamespaces         = []byte("namespaces")
	bucketHostBindings       = []byte("host_bindings")
	bucketHostBindingsByNQN  = []byte("host_bindings_by_nqn")
	bucketJobs               = []byte("jobs")
	bucketGrants             = []byte("grants")
	bucketGrantsBySubsystem  = []byte("grants_by_subsystem")
	bucketGrantsByNode       = []byte("grants_by_node")
	bucketGrantsByHost       = []byte("grants_by_host")
	// bucketGrantsPending indexes the ended grants whose removal from
	// their target is not acknowledged yet (Grant.RemovalPending).
	bucketGrantsPending = []byte("grants_removal_pending")
	// bucketHostKeyScopes remembers, per host NQN, which identities held
	// grants on it under which key scope, up to which root version: what
	// a host that once had the NQN can still derive (HostKeyScopes).
	bucketHostKeyScopes = []byte("host_key_scopes")
	// bucketGrantsSuperseded indexes the released grants a connect
	// superseded that may still be put back (Grant.SupersededBy): key
	// successor ID 0x00 grant ID. Empty in files older than it: their
	// released grants are final.
	bucketGrantsSuperseded = []byte("grants_superseded")
	// bucketRequests and bucketRequestsByTime remember the forwarded
	// writes (forward.go): their IDs are state, so every leader knows
	// them.
	bucketRequests       = []byte("requests")
	bucketRequestsByTime = []byte("requests_by_time")

	// allBuckets are created by Open if missing.
	allBuckets = [][]byte{
		bucketMeta, bucketTargets, bucketSubsystems, bucketSubsystemsByTarget,
		bucketNamespaces, bucketHostBindings, bucketHostBindingsByNQN, bucketJobs,
		bucketGrants, bucketGrantsBySubsystem, bucketGrantsByNode, bucketGrantsByHost, bucketGrantsPending, bucketHostKeyScopes,
		bucketPolicy, bucketRoots,
		bucketGrantsSuperseded, bucketRequests, bucketRequestsByTime,
	}

	metaKind     = []byte("kind")
	metaSchema   = []byte("schema_version")
	metaRevision = []byte("revision")
)

// DefaultTimeout is how long Open waits for the file lock when
// Options.Timeout is zero.
const DefaultTimeout = time.Second

// Options configure a DB. The zero value is ready to use.
type Options struct {
	// Now returns the time stamped into CreatedAt. Default time.Now; tests
	// inject a fixed clock.
	Now func() time.Time

	// Timeout bounds how long Open waits for the exclusive file lock held
	// by another process. Zero means DefaultTimeout (1s); negative is an
	// error. The store never waits forever: a second daemon on the same file
	// must fail loudly, not hang.
	Timeout time.Duration

	// Applied, with a Forward, hears of each change of another replica:
	// its revision and the targets and subsystems whose desired state it
	// may change (a replica programs the targets whose agents stream from
	// it). It is called just before Revision moves to the change, so one
	// who reads Revision and then takes what Applied noted up to it has
	// heard of every change up to it; reads see the change once Revision
	// has. It must not block.
	Applied func(rev uint64, targets, subsystems []string)
	// Journal, if set, is the log the store sequences
	// its changes in (journal.go): each write commits there, with its
	// entries, and the file is a projection checkpointed every
	// CheckpointInterval (default DefaultCheckpointInterval). Open
	// replays the changes the file lacks.
	Journal            Journal
	CheckpointInterval time.Duration
	// Forward, with a Journal replicated among gateway replicas (an
	// audit.Log on etcd), carries this replica's writes to the term's
	// leader, which sequences them (forward.go); the file is then a
	// projection of the journal's changes, applied as they arrive. The
	// replica sequences writes itself only while it leads (Lead).
	Forward Forwarder

	// Revoked, with a Forward, hears of the key scopes of the grants each
	// change of another replica ended as revoked, at the same moment as
	// Applied (before Revision moves): the revocation rotated those scopes'
	// roots before it was stored, so a replica drops the roots it keeps
	// for them and reads the new ones. It must not block.
	Revoked func(scopes []string)

	// PolicyLoaded hears of each policy a change makes the one in force
	// (LoadPolicy), on every replica, as the change is applied and before
	// the revision moves (a call waiting for that revision finds it): the
	// gateway's policy engine swaps to it there. It is called with the
	// store's write lock held: a slow one holds up writes. Open's replay
	// calls it too, before Open returns.
	PolicyLoaded func(p *Policy)

	// RootRotated hears of each access root rotation a change notes
	// (NoteRootRotated), on every replica, as the change is applied and
	// before the revision moves: the
	// replica drops the roots it keeps of that scope and reads the new
	// one. Called with the store's write lock held; it must not block.
	RootRotated func(scope string, version uint64)
}

// DB is the inventory store. Its methods are safe for concurrent use: the
// hot-path reads are served from the in-memory model (model.go), the other
// reads run in concurrent read transactions, and writes in one serialized
// write transaction each, fsync'd on commit and then applied to the model.
type DB struct {
	bolt    *bolt.DB
	now     func() time.Time
	batcher batcher
	// writeMu is held from the start of a write transaction until its
	// change is applied to the model, so that changes are applied in
	// commit order. bbolt serializes writers anyway: it costs no
	// concurrency.
	writeMu sync.Mutex
	model   model
	applied func(rev uint64, targets, subsystems []string)
	revoked func(scopes []string)
	journal Journal
	jr      journalState
	lead    leadership
}

// Open opens (creating if needed, mode 0600) the store file at path, creates
// missing buckets, checks the schema version and loads the read model.
func Open(path string, opts Options) (*DB, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch {
	case opts.Timeout < 0:
		return nil, fmt.Errorf("store: open %s: negative lock timeout %s", path, opts.Timeout)
	case opts.Timeout == 0:
		opts.Timeout = DefaultTimeout
	}
	db, err := openFile(path, opts)
	if err != nil {
		return nil, err
	}
	bdb := db.bolt
	if opts.Forward != nil && opts.Journal == nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("store: open %s: a forwarding replica needs a Journal", path)
	}
	if opts.Journal != nil {
		interval := opts.CheckpointInterval
		if interval <= 0 {
			interval = DefaultCheckpointInterval
		}
		if err := db.openJournal(opts.Journal, interval); err != nil {
			_ = bdb.Close()
			return nil, fmt.Errorf("store: open %s: %w", path, err)
		}
	}
	return db, nil
}

// openFile opens the file and loads the model from it.
func openFile(path string, opts Options) (*DB, error) {
	bdb, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("store: open %s: %w (waited %s; is another nvmegated using it?)", path, ErrLocked, opts.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if err := bdb.Update(initSchema); err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db := &DB{bolt: bdb, now: opts.Now, applied: opts.Applied, revoked: opts.Revoked}
	db.model.onPolicy = opts.PolicyLoaded
	if f := opts.RootRotated; f != nil {
		db.model.onRoot = func(r *RootRotation) { f(r.Scope, r.Version) }
	}
	if opts.Forward != nil {
		db.lead.forward, db.lead.advanced = opts.Forward, make(chan struct{})
	}
	if err := bdb.View(func(tx *bolt.Tx) error {
		recs, rev, err := load(tx)
		db.model.records = recs
		db.model.rev.Store(rev)
		db.model.scopeRev.Store(rev)
		return err
	}); err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("store: open %s: load: %w", path, err)
	}
	return db, nil
}

// initSchema stamps a new file, or checks an existing one, and creates any
// missing bucket.
func initSchema(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		// Only an empty file becomes a store: never add our buckets to
		// someone else's database.
		if k, _ := tx.Cursor().First(); k != nil {
			return fmt.Errorf("%w: it has buckets but no %q bucket", ErrNotStore, bucketMeta)
		}
		var err error
		if meta, err = tx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(metaKind, []byte(storeKind)); err != nil {
			return err
		}
		if err := meta.Put(metaSchema, binary.BigEndian.AppendUint64(nil, SchemaVersion)); err != nil {
			return err
		}
	}
	if kind := meta.Get(metaKind); string(kind) != storeKind {
		return fmt.Errorf("%w: kind is %q, want %q", ErrNotStore, kind, storeKind)
	}
	v := meta.Get(metaSchema)
	if len(v) != 8 {
		return fmt.Errorf("corrupt schema version (%d bytes)", len(v))
	}
	switch version := binary.BigEndian.Uint64(v); {
	case version > SchemaVersion:
		return fmt.Errorf("%w: the file has version %d, this binary knows versions up to %d; run a newer nvmegate", ErrSchemaTooNew, version, SchemaVersion)
	case version < 1:
		return fmt.Errorf("corrupt schema version %d", version)
	}
	// Migrations from older versions go here, in this transaction.
	// Indexes added after version 1's first files are filled when missing.
	indexNodes := tx.Bucket(bucketGrantsByNode) == nil
	indexHosts := tx.Bucket(bucketGrantsByHost) == nil
	indexScopes := tx.Bucket(bucketHostKeyScopes) == nil
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	if indexNodes {
		if err := indexActiveGrantsByNode(tx); err != nil {
			return err
		}
	}
	if indexHosts {
		if err := indexActiveGrantsByHost(tx); err != nil {
			return err
		}
	}
	if indexScopes {
		if err := indexHostKeyScopes(tx); err != nil {
			return err
		}
	}
	return canonicalizeHostIndex(tx)
}

// Revision is the revision of the data the model serves: that of the last
// committed write transaction. It grows by one with every commit and is
// stored in the file, so it keeps growing across restarts. A decision can
// name the revision it read (the reads it made may see a later one, never
// an earlier one).
func (db *DB) Revision() uint64 { return db.model.rev.Load() }

// ScopeRevision is the revision of the last commit that changed anything a
// call's scope is read from — inventory, bindings or jobs — rather than
// grants alone: a policy decision over a scope stays the same decision
// until it changes (or the policy does), however many grants are written
// meanwhile. It starts, after Open, at the revision read from the file.
func (db *DB) ScopeRevision() uint64 { return db.model.scopeRev.Load() }

// Close releases the file. Calls after Close fail with ErrClosed.
func (db *DB) Close() error {
	if db.journal != nil {
		db.closeJournal()
	}
	db.model.close()
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("store: close: %w", err)
	}
	return nil
}

// view runs fn in a read transaction. Errors of fn are returned unchanged:
// *nvmegate.Error for the caller, or errors already wrapped with context.
func (db *DB) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if db.journal != nil {
		return db.viewJournaled(fn)
	}
	tx, err := db.bolt.Begin(false)
	if err != nil {
		return beginError(err)
	}
	defer func() { _ = tx.Rollback() }()
	return fn(tx)
}

// txn is a write transaction and the change it makes to the model: each
// write records what it stored (record), and the change is applied once
// the transaction has committed. A rolled-back transaction's change is
// dropped with it.
type txn struct {
	*bolt.Tx
	ops    []op
	writes []Write // every key written: the change's payload in the Journal
	model  *model  // as of the last commit: this transaction's writes are in ops

	// A journaled change's: the index its first entry gets, and, with
	// undo, the keys as they were before it wrote them (rollback).
	first   uint64
	entries []audit.Entry // the change's own entries (none: its proposal's)
	undo    bool
	undoLog []undoRec
}

func (tx *txn) record(o op) { tx.ops = append(tx.ops, o) }

// bindingOf is node's host binding as this transaction sees it (nil:
// none): written by it, or else as committed — the model, not the file:
// every connect's commit asks, and the writer's lock keeps the model at
// the last commit.
func (tx *txn) bindingOf(node string) (*nvmegate.HostBinding, error) {
	for i := len(tx.ops) - 1; i >= 0; i-- {
		if o := tx.ops[i]; o.binding != nil && o.binding.SPIFFEID == node {
			if o.del {
				return nil, nil
			}
			return o.binding, nil
		}
	}
	b, err := tx.model.hostBinding(context.Background(), node)
	if nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
		return nil, nil
	}
	return b, err
}

// jobState is job id's state as this transaction sees it ("" if there is
// no such job): written by it, or else as committed. The model serves it
// for an active job, and for an ended one it keeps — not the file: a job
// of 10,000 nodes is a large record to decode, and every grant write
// asks.
func (tx *txn) jobState(id string) string {
	for i := len(tx.ops) - 1; i >= 0; i-- {
		if j := tx.ops[i].job; j != nil && j.ID == id {
			return j.State
		}
	}
	tx.model.mu.RLock()
	j := tx.model.jobs[id]
	tx.model.mu.RUnlock()
	if j != nil {
		return j.State
	}
	if j := tx.model.ended.get(id); j != nil {
		return j.State
	}
	// Ended long ago, or none: the file says (rarely asked: a grant
	// written for a job that is not active). A record that does not
	// decode is no active job.
	j, err := getJob(tx.Tx, id)
	switch {
	case err == nil:
		return j.State
	case nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND:
		return ""
	}
	return "unreadable"
}

// jobHasNode says whether node is in job id's node set as tx sees it: a
// job this transaction wrote, else the model's active job. A job that is
// not active or unknown to the store says yes: jobState's check is the
// one that refuses those.
func (tx *txn) jobHasNode(id, node string) bool {
	for i := len(tx.ops) - 1; i >= 0; i-- {
		if j := tx.ops[i].job; j != nil && j.ID == id {
			return j.State != nvmegate.JobActive || slices.Contains(j.Nodes, node)
		}
	}
	tx.model.mu.RLock()
	defer tx.model.mu.RUnlock()
	set, ok := tx.model.jobNodes[id]
	if !ok {
		return true
	}
	_, in := set[node]
	return in
}

// update runs fn in a write transaction, stamps the next revision,
// commits (fsync) if fn succeeds, and applies the change to the model; on
// a journaled store it is a proposal the journal sequences.
func (db *DB) update(ctx context.Context, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if db.journal != nil {
		return db.propose(ctx, nil, fn)
	}
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	return db.updateOnce(fn)
}

func (db *DB) updateOnce(fn func(*txn) error) error {
	btx, err := db.bolt.Begin(true)
	if err != nil {
		return beginError(err)
	}
	defer func() { _ = btx.Rollback() }() // no-op after a successful Commit
	tx := &txn{Tx: btx, model: &db.model}
	if err := fn(tx); err != nil {
		return err
	}
	if len(tx.writes) == 0 {
		return nil // nothing changed: no revision, as on a journaled store
	}
	rev := db.model.rev.Load() + 1
	if err := put(tx, bucketMeta, metaRevision, binary.BigEndian.AppendUint64(nil, rev)); err != nil {
		return err
	}
	if err := btx.Commit(); err != nil {
		return fmt.Errorf("store: commit: %w", err)
	}
	db.model.apply(change{revision: rev, ops: tx.ops})
	return nil
}

func beginError(err error) error {
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return fmt.Errorf("store: begin transaction: %w", err)
}

// put writes one key of bucket name, wrapping bbolt's error with context.
func put(tx *txn, name, k, v []byte) error {
	if v == nil {
		// An index key's value is empty. Stored as nil, bbolt's Get would
		// answer nil — absent — within the transaction that wrote it
		// (a journaled store's transaction spans many changes), and
		// empty once committed.
		v = []byte{}
	}
	if tx.undo {
		tx.noteUndo(name, k)
	}
	if err := tx.Bucket(name).Put(k, v); err != nil {
		return fmt.Errorf("store: put %s: %w", name, err)
	}
	tx.writes = append(tx.writes, Write{Bucket: name, Key: k, Value: v})
	return nil
}

// del deletes one key of bucket name, wrapping bbolt's error with context.
func del(tx *txn, name, k []byte) error {
	if tx.undo {
		tx.noteUndo(name, k)
	}
	if err := tx.Bucket(name).Delete(k); err != nil {
		return fmt.Errorf("store: delete %s: %w", name, err)
	}
	tx.writes = append(tx.writes, Write{Bucket: name, Key: k, Delete: true})
	return nil
}
