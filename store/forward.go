package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	bolt "go.etcd.io/bbolt"
	"sync"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
)

// Forwarder carries a write of a replica that is not the term's leader to
// the one that is (an internal gRPC call): the leader runs it with Apply
// and answers with Apply's answer. A Forwarder that retries a request
// whose answer it lost must make the leader answer the retry as the
// first (forward: a request ID the leader remembers).
type Forwarder interface {
	Forward(ctx context.Context, req []byte) ([]byte, error)
}

// ErrNotLeader is Apply's answer on a replica that is not the term's
// leader (any more): the forwarder asks the leader it learns of next. A
// write that found no leader fails with it too, as EUNAVAILABLE.
var ErrNotLeader = errors.New("store: this replica is not the term's leader")

// ErrLeadsHere is a Forwarder's answer when this replica has become the
// term's leader while the write waited: the write runs here.
var ErrLeadsHere = errors.New("store: this replica leads now")

// notSequenced is a write's error when no leader took it: nothing changed.
func notSequenced(err error) error {
	return fmt.Errorf("%w: %w", err, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "no gateway replica leads now; the write was not made (retry)"))
}

// forwards says whether this store is a replica that may forward its
// writes: checked before a write builds its forwarded form, so that a
// gateway running alone pays nothing for it on the connect path.
func (db *DB) forwards() bool { return db.lead.forward != nil }

// Leading reports whether this replica sequences writes now: it runs
// alone, or it leads the term.
func (db *DB) Leading() bool { return db.follower() == nil }

// request is one write as data: what a follower forwards and the leader
// applies. Op names the store method, Args are its arguments; Call is the
// call's entry (WithCallRecord) if the follower's call had one no write
// took yet.
type request struct {
	Op   string          `json:"op"`
	Args json.RawMessage `json:"args"`
	Call *audit.Entry    `json:"call,omitempty"`
}

// response is the leader's answer: the method's results, and where the
// call's entry went.
type response struct {
	Result json.RawMessage `json:"result,omitempty"`
	// Revision is the leader's after the write: the follower reads its
	// own writes once its projection is there.
	Revision  uint64 `json:"revision,omitempty"`
	CallIndex uint64 `json:"call_index,omitempty"`
	CallUsed  bool   `json:"call_used,omitempty"`
}

// forwarded is a write method's arguments and results as data: run calls
// the method on the leader's store, filling in the results.
type forwarded interface {
	run(ctx context.Context, db *DB) error
}

// ops are the store's writes by name: what Apply runs.
var ops = map[string]func() forwarded{
	"put_grants_moving":   func() forwarded { return &putGrantsMovingOp{} },
	"open_grant":          func() forwarded { return &openGrantOp{} },
	"put_grants_recorded": func() forwarded { return &putGrantsRecordedOp{} },
	"undo_opening":        func() forwarded { return &undoOpeningOp{} },
	"settle_removals":     func() forwarded { return &settleRemovalsOp{} },
	"require_reauth":      func() forwarded { return &requireReauthOp{} },
	"create_host_binding": creating((*DB).CreateHostBinding),
	"delete_host_binding": func() forwarded { return &deleteOp{} },
	"create_job":          creating((*DB).CreateJob),
	"finish_job":          func() forwarded { return &finishJobOp{} },
	"update_job_nodes":    func() forwarded { return &updateJobNodesOp{} },
	"load_policy":         func() forwarded { return &loadPolicyOp{} },
	"note_root_rotated":   func() forwarded { return &noteRootOp{} },
	"create_namespace":    creating((*DB).CreateNamespace),
	"delete_namespace":    func() forwarded { return &deleteNamespaceOp{} },
	"create_subsystem":    creating((*DB).CreateSubsystem),
	"delete_subsystem":    func() forwarded { return &deleteOp{} },
	"create_target":       creating((*DB).CreateTarget),
	"delete_target":       func() forwarded { return &deleteOp{} },
}

// leadership is a replicated store's role: the term it leads (its
// context carries the fence its proposals commit under), or the
// forwarder to the leader.
type leadership struct {
	mu      sync.Mutex
	term    context.Context // nil or done: not leading
	forward Forwarder
	// advanced is closed when the projection moves (awaitRevision).
	advanced chan struct{}
}

// leading is the term's context if this replica leads now.
func (db *DB) leading() (context.Context, bool) {
	l := &db.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.term == nil || l.term.Err() != nil {
		return nil, false
	}
	return l.term, true
}

// follower is the forwarder a write goes to, or nil: this replica
// sequences (it leads, or it runs alone).
func (db *DB) follower() Forwarder {
	if db.lead.forward == nil {
		return nil
	}
	if _, ok := db.leading(); ok {
		return nil
	}
	return db.lead.forward
}

// Lead makes this replica the sequencer for the term of ctx (whose
// condition, audit.WithCondition, is the term's fence) once its copy has
// every change of the log: it catches up, then takes writes until ctx
// ends. Writes before then, and after, go to the Forwarder.
func (db *DB) Lead(ctx context.Context) error {
	if db.journal == nil || db.lead.forward == nil {
		return errors.New("store: only a replicated journaled store leads")
	}
	if audit.ConditionOf(ctx) == nil {
		return errors.New("store: a term needs its fence (audit.WithCondition)")
	}
	if err := db.Sync(ctx); err != nil {
		return err
	}
	if err := db.caughtUp(); err != nil {
		return err
	}
	if err := db.genesisIfNeeded(ctx); err != nil {
		return err
	}
	db.lead.mu.Lock()
	db.lead.term = ctx
	db.lead.mu.Unlock()
	return nil
}

// caughtUp refuses to lead unless the projection holds every change of
// the log's copy: a term must not sequence on a state behind its log.
func (db *DB) caughtUp() error {
	db.writeMu.Lock()
	defer db.writeMu.Unlock()
	if err := db.projectLocked(); err != nil {
		return err
	}
	last, err := db.journal.LastChange()
	if err != nil {
		return err
	}
	if rev := db.model.rev.Load(); len(db.jr.inflight) > 0 || (last != 0 && rev != last) {
		return fmt.Errorf("%w: the store is at revision %d, its log's changes end at %d (changes in flight: %d)", ErrJournal, rev, last, len(db.jr.inflight))
	}
	return nil
}

// genesisIfNeeded records, once, the state of a store older than its
// journal's changes (replicas upgraded from a replicated store that was
// not a projection): the first leader records it under its fence, and
// every replica's changes start from it.
func (db *DB) genesisIfNeeded(ctx context.Context) error {
	last, err := db.journal.LastChange()
	if err != nil || last != 0 {
		return err
	}
	rev := db.model.rev.Load()
	if rev == 0 {
		return nil
	}
	found, err := db.journal.Snapshot(func(uint64, uint64, []byte) error { return nil })
	if err != nil || found {
		return err
	}
	return db.recordGenesis(ctx, db.journal, rev)
}

// resign ends term if it is still this replica's: a proposal under its
// fence was fenced, so another replica leads.
func (db *DB) resign(term context.Context) {
	l := &db.lead
	l.mu.Lock()
	defer l.mu.Unlock()
	if term != nil && l.term == term {
		l.term = nil
	}
}

// forward sends the write op (its arguments in args) to the leader and
// decodes the results into res. The call's entry, if ctx carries one no
// write took, goes with it.
func (db *DB) forward(ctx context.Context, f Forwarder, op string, args forwarded) error {
	body, err := json.Marshal(args)
	if err != nil {
		return fmt.Errorf("store: encode %s: %w", op, err)
	}
	req := request{Op: op, Args: body}
	_, rec := callEntries(ctx, nil)
	if rec != nil {
		e := rec.Entry
		req.Call = &e
	}
	wire, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("store: encode %s: %w", op, err)
	}
	out, err := f.Forward(ctx, wire)
	if err != nil {
		if rec != nil {
			rec.settle(0, false)
		}
		if errors.Is(err, ErrNotLeader) {
			return notSequenced(err)
		}
		return err
	}
	var resp response
	if err := json.Unmarshal(out, &resp); err != nil {
		return fmt.Errorf("store: the leader's answer to %s: %w", op, err)
	}
	if rec != nil {
		rec.settle(resp.CallIndex, resp.CallUsed)
	}
	if len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, args); err != nil {
			return fmt.Errorf("store: the leader's answer to %s: %w", op, err)
		}
	}
	// The write is in the log; reads through this replica see it from
	// now on (read your writes).
	return db.awaitRevision(ctx, resp.Revision)
}

// awaitRevision waits until this replica's projection reaches rev: the
// log's watch brings the leader's commit within a round trip; past
// watchWait, a Sync reads it.
func (db *DB) awaitRevision(ctx context.Context, rev uint64) error {
	wctx, cancel := context.WithTimeout(ctx, watchWait)
	defer cancel()
	for {
		db.lead.mu.Lock()
		ch := db.lead.advanced
		db.lead.mu.Unlock()
		if db.model.rev.Load() >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-wctx.Done():
			return db.Sync(ctx)
		}
	}
}

// watchWait bounds awaitRevision's wait for the log's watch.
const watchWait = 100 * time.Millisecond

// advance wakes awaitRevision: the projection moved. writeMu is held.
func (db *DB) advance() {
	db.lead.mu.Lock()
	defer db.lead.mu.Unlock()
	if db.lead.advanced != nil {
		close(db.lead.advanced)
	}
	db.lead.advanced = make(chan struct{})
}

// WithRequestID marks the writes Apply runs under ctx with the forwarded
// request's ID: the change records it, so that a retry of the request
// through any later leader is recognised (ErrAppliedBefore), not applied
// again.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestKey{}, &requestID{id: id})
}

type requestKey struct{}

// requestID is a forwarded request's ID as its writes run (propose): its
// first change checks, in the sequencer's transaction, that the log and
// the changes in flight before it do not hold the ID, and records it; a
// later change of the same write (one made of several) does not check.
// The check runs in the sequencer, not in a read before it: a read waits
// for a moment with nothing in flight, and two retries racing would both
// pass it.
type requestID struct {
	id    string
	noted bool
}

// errAppliedBefore is ErrAppliedBefore as a caller learns it.
func errAppliedBefore() error {
	return fmt.Errorf("%w: %w", ErrAppliedBefore, nvmegate.Errorf(nvmegate.EUNAVAILABLE,
		"the write was made once, by the gateway replica that led before; its answer was lost with it"))
}

// ErrAppliedBefore is Apply's answer to a request the log holds already:
// a retry whose first answer was lost with the leader that gave it. The
// write happened once; its results are not known here, so the caller
// learns it as a failure whose outcome is unknown (EUNAVAILABLE), never
// as a second write.
var ErrAppliedBefore = errors.New("store: the forwarded write was applied before, by an earlier leader; its answer was lost")

// requestKeep bounds how long a forwarded request's ID is kept: far
// longer than any forwarder retries.
const requestKeep = 10 * time.Minute

// noteRequest records request id in tx's change, and forgets a few IDs
// older than requestKeep (each change prunes what it can: no sweep).
func noteRequest(tx *txn, id string, now time.Time) error {
	t := binary.BigEndian.AppendUint64(nil, uint64(now.UnixNano()))
	if err := put(tx, bucketRequests, []byte(id), t); err != nil {
		return err
	}
	if err := put(tx, bucketRequestsByTime, append(t, id...), nil); err != nil {
		return err
	}
	cutoff := uint64(now.Add(-requestKeep).UnixNano())
	var old [][]byte
	c := tx.Bucket(bucketRequestsByTime).Cursor()
	for k, _ := c.First(); k != nil && len(old) < 4 && len(k) > 8 && binary.BigEndian.Uint64(k) < cutoff; k, _ = c.Next() {
		old = append(old, bytes.Clone(k))
	}
	for _, k := range old {
		if err := del(tx, bucketRequestsByTime, k); err != nil {
			return err
		}
		if err := del(tx, bucketRequests, k[8:]); err != nil {
			return err
		}
	}
	return nil
}

// Apply runs a write a follower forwarded, on the term's leader, and
// returns the answer for Forward. A replica that does not lead answers
// ErrNotLeader; a request the log holds already (WithRequestID),
// ErrAppliedBefore.
func (db *DB) Apply(ctx context.Context, wire []byte) ([]byte, error) {
	if _, ok := db.leading(); !ok {
		return nil, ErrNotLeader
	}
	var req request
	if err := json.Unmarshal(wire, &req); err != nil {
		return nil, nvmegate.Invalid("", "a forwarded write that does not decode: %v", err)
	}
	mk, ok := ops[req.Op]
	if !ok {
		return nil, nvmegate.Invalid("", "a forwarded write of unknown kind %q", req.Op)
	}
	if id, ok := ctx.Value(requestKey{}).(*requestID); ok {
		// Early, so that a retry is not refused for what its first
		// attempt did (AlreadyExists): an ID in flight counts, its
		// outcome unknown. Its first change checks again, in the
		// sequencer.
		var noted bool
		err := db.viewInFlight(func(tx *bolt.Tx) error {
			noted = tx.Bucket(bucketRequests).Get([]byte(id.id)) != nil
			return nil
		})
		if err != nil {
			return nil, err
		}
		if noted {
			return nil, errAppliedBefore()
		}
	}
	args := mk()
	if err := json.Unmarshal(req.Args, args); err != nil {
		return nil, nvmegate.Invalid("", "forwarded %s: %v", req.Op, err)
	}
	if (req.Call != nil && req.Call.Change != nil) || carriesChange(args) {
		// Only the sequencer records changes: a forwarded entry that
		// claims one would name a payload the log does not hold.
		return nil, nvmegate.Invalid("", "a forwarded %s carries an entry that claims a change", req.Op)
	}
	var rec *CallRecord
	if req.Call != nil {
		rec = &CallRecord{Entry: *req.Call}
		ctx = WithCallRecord(ctx, rec)
	}
	ctx = context.WithValue(ctx, appliedKey{}, true)
	if err := args.run(ctx, db); err != nil {
		return nil, err
	}
	result, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	resp := response{Result: result, Revision: db.model.rev.Load()}
	if rec != nil {
		resp.CallIndex, resp.CallUsed = rec.Index()
	}
	return json.Marshal(resp)
}

// carriesChange says whether a forwarded write's entries claim a change.
func carriesChange(args forwarded) bool {
	switch o := args.(type) {
	case *openGrantOp:
		return o.Entry != nil && o.Entry.Entry.Change != nil
	case *putGrantsRecordedOp:
		for _, e := range o.Entries {
			if e.Change != nil {
				return true
			}
		}
	}
	return false
}

// appliedKey marks a write Apply runs: it is sequenced here or refused,
// never forwarded again (a leader that lost its term meanwhile).
type appliedKey struct{}

// route says how a write method runs: forwarded (f not nil), or here.
// A forwarded write applied here on a replica that lost its term is
// refused rather than sent on.
func (db *DB) route(ctx context.Context) (Forwarder, error) {
	f := db.follower()
	if f != nil && (ctx.Value(appliedKey{}) != nil || audit.ConditionOf(ctx) != nil) {
		// Applied for another replica, or the work of a term (under its
		// fence) that this replica no longer leads: never sent on, where
		// the new leader would make it unfenced.
		return nil, ErrNotLeader
	}
	return f, nil
}

// The forwarded writes, each the arguments and results of one method.

type putGrantsMovingOp struct {
	Grants []*nvmegate.Grant   `json:"grants"`
	Move   []string            `json:"move,omitempty"`
	From   *nvmegate.HostEntry `json:"from,omitempty"`
	To     nvmegate.HostEntry  `json:"to"`
}

func (o *putGrantsMovingOp) run(ctx context.Context, db *DB) error {
	return db.PutGrantsMoving(ctx, o.Grants, o.Move, o.From, o.To)
}

type openGrantOp struct {
	Grant      *nvmegate.Grant   `json:"grant"`
	Move       []string          `json:"move,omitempty"`
	Supersede  bool              `json:"supersede,omitempty"`
	At         *BindingAt        `json:"at,omitempty"`
	Entry      *OpeningEntry     `json:"entry,omitempty"`
	Superseded []*nvmegate.Grant `json:"superseded,omitempty"` // result
}

func (o *openGrantOp) run(ctx context.Context, db *DB) (err error) {
	if o.Entry != nil {
		o.Superseded, err = db.OpenGrantRecorded(ctx, o.Grant, o.Move, o.Supersede, o.At, *o.Entry)
	} else {
		o.Superseded, err = db.OpenGrant(ctx, o.Grant, o.Move, o.Supersede, o.At)
	}
	return err
}

type putGrantsRecordedOp struct {
	Grants  []*nvmegate.Grant `json:"grants"`
	Entries []audit.Entry     `json:"entries"`
}

func (o *putGrantsRecordedOp) run(ctx context.Context, db *DB) error {
	return db.PutGrantsRecorded(ctx, o.Grants, o.Entries)
}

type undoOpeningOp struct {
	Grant *nvmegate.Grant   `json:"grant"`
	Back  []*nvmegate.Grant `json:"back,omitempty"` // result
}

func (o *undoOpeningOp) run(ctx context.Context, db *DB) (err error) {
	o.Back, err = db.UndoOpening(ctx, o.Grant)
	return err
}

type settleRemovalsOp struct {
	IDs []string `json:"ids"`
}

func (o *settleRemovalsOp) run(ctx context.Context, db *DB) error {
	return db.SettleRemovals(ctx, o.IDs)
}

type requireReauthOp struct {
	Marks  []ReauthMark      `json:"marks"`
	Marked []*nvmegate.Grant `json:"marked,omitempty"` // result
}

func (o *requireReauthOp) run(ctx context.Context, db *DB) (err error) {
	o.Marked, err = db.RequireReauth(ctx, o.Marks)
	return err
}

// createOp stores a new record (Record) with its store method (do, set on
// the leader by the ops table; a follower sends Record alone).
type createOp[T any] struct {
	Record *T `json:"record"`
	do     func(*DB, context.Context, *T) error
}

func (o *createOp[T]) run(ctx context.Context, db *DB) error { return o.do(db, ctx, o.Record) }

// creating is the ops table's maker of a create op for method do.
func creating[T any](do func(*DB, context.Context, *T) error) func() forwarded {
	return func() forwarded { return &createOp[T]{do: do} }
}

// deleteOp removes a record by its ID: a host binding, a subsystem or a
// target (Kind says which).
type deleteOp struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

func (o *deleteOp) run(ctx context.Context, db *DB) error {
	switch o.Kind {
	case "host_binding":
		return db.DeleteHostBinding(ctx, o.ID)
	case "subsystem":
		return db.DeleteSubsystem(ctx, o.ID)
	case "target":
		return db.DeleteTarget(ctx, o.ID)
	}
	return nvmegate.Invalid("", "a forwarded delete of unknown kind %q", o.Kind)
}

type finishJobOp struct {
	ID         string        `json:"id"`
	Generation *uint32       `json:"generation,omitempty"`
	Job        *nvmegate.Job `json:"job,omitempty"` // result
	Unchanged  bool          `json:"unchanged,omitempty"`
}

func (o *finishJobOp) run(ctx context.Context, db *DB) (err error) {
	o.Job, o.Unchanged, err = db.FinishJob(ctx, o.ID, o.Generation)
	return err
}

type noteRootOp struct {
	Rotation RootRotation `json:"rotation"`
}

func (o *noteRootOp) run(ctx context.Context, db *DB) error {
	return db.NoteRootRotated(ctx, o.Rotation)
}

type loadPolicyOp struct {
	Policy *Policy     `json:"policy"`
	Entry  audit.Entry `json:"entry"`
	Loaded bool        `json:"loaded,omitempty"` // result
}

func (o *loadPolicyOp) run(ctx context.Context, db *DB) (err error) {
	o.Loaded, err = db.LoadPolicy(ctx, o.Policy, o.Entry)
	return err
}

type deleteNamespaceOp struct {
	NQN  string `json:"nqn"`
	NSID uint32 `json:"nsid"`
}

func (o *deleteNamespaceOp) run(ctx context.Context, db *DB) error {
	return db.DeleteNamespace(ctx, o.NQN, o.NSID)
}

// remote runs a write on the leader if this replica forwards its writes;
// ok reports that it did (err is then the write's answer). A write Apply
// runs on a replica that lost its term meanwhile is refused, not sent on.
func (db *DB) remote(ctx context.Context, op string, args forwarded) (ok bool, err error) {
	f, err := db.route(ctx)
	if err != nil {
		return true, err
	}
	if f == nil {
		return false, nil
	}
	err = db.forward(ctx, f, op, args)
	if errors.Is(err, ErrLeadsHere) && ctx.Value(appliedKey{}) == nil {
		return false, nil // elected while it waited: sequenced here
	}
	return true, err
}

// opened is an opening's answer as the local method gives it: g takes
// what the leader's commit set on it (its audit index).
func (o *openGrantOp) opened(g *nvmegate.Grant, err error) ([]*nvmegate.Grant, error) {
	if err != nil {
		return nil, err
	}
	if o.Grant != nil && o.Grant != g {
		*g = *o.Grant
	}
	return o.Superseded, nil
}

type updateJobNodesOp struct {
	ID         string        `json:"id"`
	Generation *uint32       `json:"generation,omitempty"`
	Add        []string      `json:"add,omitempty"`
	Remove     []string      `json:"remove,omitempty"`
	Job        *nvmegate.Job `json:"job,omitempty"` // result
}

func (o *updateJobNodesOp) run(ctx context.Context, db *DB) (err error) {
	o.Job, err = db.UpdateJobNodes(ctx, o.ID, o.Generation, o.Add, o.Remove)
	return err
}
