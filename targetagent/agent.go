package targetagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// ErrNotManaged is returned by Program for a target no driver of this
// agent programs: nothing was applied, so no grant may be answered.
var ErrNotManaged = errors.New("targetagent: no driver programs this target")

// Store is what the agent reads.
type Store interface {
	Target(ctx context.Context, id string) (*nvmegate.Target, error)
	ListTargets(ctx context.Context, f store.TargetFilter, p store.Page) ([]*nvmegate.Target, string, error)
	ListSubsystems(ctx context.Context, f store.SubsystemFilter, p store.Page) ([]*nvmegate.Subsystem, string, error)
	ListNamespaces(ctx context.Context, f store.NamespaceFilter, p store.Page) ([]*nvmegate.Namespace, string, error)
	// SubsystemGrants serves the whole state: every active grant of a
	// subsystem.
	SubsystemGrants(ctx context.Context, subsystemNQN string) ([]*nvmegate.Grant, error)
	// NodeActiveGrants serves a change of one host entry: the grants of
	// the nodes holding it, without the subsystem's others.
	NodeActiveGrants(ctx context.Context, node string) ([]*nvmegate.Grant, error)
	// Revision is the revision of the store's latest applied change: a
	// state read before it holds no later change.
	Revision() uint64
}

// Credentials derives a grant's credentials.
type Credentials interface {
	CredentialsAt(ctx context.Context, hostNQN, subNQN string, version uint64, p keys.CredentialParams) (keys.Credentials, error)
	// NamespaceKeys returns the data key of the namespace record owner
	// (its incarnation), unwrapped (made on first use), and the key a
	// rotation under way re-encrypts it to, for the namespaces the target
	// exports encrypted at rest.
	NamespaceKeys(ctx context.Context, namespace, owner string) (keys.NamespaceKeys, error)
}

// Driver programs one target (fabric/nvmet, fabric/spdk). Both methods
// are idempotent; the agent calls them one at a time per target.
type Driver interface {
	// Apply makes the target match a whole state, exactly, for the
	// subsystems it names.
	Apply(ctx context.Context, s fabric.State) error
	// ApplyDelta applies a change of host entries to the state the driver
	// last applied. A driver that does not hold it (none applied, or the
	// last application failed) refuses with fabric.ErrNeedFull and changes
	// nothing; the agent then applies the whole state.
	ApplyDelta(ctx context.Context, d fabric.Delta) error
}

// HostRef names a host entry of a target whose grants changed (the root's
// nvmegate.HostRef: those who change grants name it without importing the
// agent).
type HostRef = nvmegate.HostRef

// HostOf is the host entry g belongs to.
func HostOf(g *nvmegate.Grant) HostRef { return g.HostRef() }

// HostsOf are the host entries of gs.
func HostsOf(gs ...*nvmegate.Grant) []HostRef { return nvmegate.HostRefs(gs...) }

// Agent programs targets through their drivers, or through their own
// agents connected to Hub. It keeps each target's desired state and
// changes it one host entry at a time (see Program).
type Agent struct {
	Store Store
	Keys  Credentials
	// Driver returns the driver of a target (nil: the target is not
	// programmed by this agent, and Program fails with ErrNotManaged). It
	// should return the same driver for a target every time: a driver
	// remembers what it applied, and a different one gets whole states.
	Driver func(t *nvmegate.Target) Driver
	Now    func() time.Time
	Log    *slog.Logger
	// Hub, if set, connects remote agents: a target whose agent is
	// connected is programmed through it, not by a local driver.
	Hub *Hub
	// Peers, for one of several gateway replicas, reaches the targets
	// whose agents stream from another replica: a target with neither a
	// stream here nor a local driver is programmed by that replica, and
	// Program waits for its agent's acknowledgement through Peers.
	Peers Peers

	mu      sync.Mutex
	targets map[string]*target
	gen     atomic.Uint64

	// notServed, by target: the namespaces of the last whole state its
	// sink took that are not served as the store says (see NotServed).
	nsMu      sync.Mutex
	notServed map[string][]fabric.NotServed
}

func (a *Agent) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.New(slog.DiscardHandler)
}

// target is the agent's side of one target. Program calls are coalesced:
// one run at a time, and every call made while a run is going is answered
// by the next run, which reads the store after all of them were made and
// carries all their changes (or the whole state, if one asked for it).
type target struct {
	mu      sync.Mutex
	running bool
	next    *run // the run the next callers wait for; nil if none is due
	stale   bool // the inventory changed: the next run rebuilds the state

	// Owned by the run going on.
	state  *desired // nil: the next run builds it from the store
	sink   sink     // where state went last
	synced bool     // sink acknowledged state at state.gen
}

type run struct {
	done chan struct{}
	err  error
	full bool             // a caller asked for the whole state
	refs map[HostRef]bool // the host entries callers changed
}

func (a *Agent) target(id string) *target {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.targets == nil {
		a.targets = map[string]*target{}
	}
	t := a.targets[id]
	if t == nil {
		t = &target{}
		a.targets[id] = t
	}
	return t
}

func (a *Agent) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// GrantParams are the credential parameters a grant was issued with.
func GrantParams(g *nvmegate.Grant) (keys.CredentialParams, error) {
	return keys.ParamsFor(g.DHCHAPHash, g.Bidirectional, g.TLS)
}

// State builds the whole desired state of a target from the store, at a
// new generation (what a whole programming run applies).
func (a *Agent) State(ctx context.Context, t *nvmegate.Target) (fabric.State, error) {
	d, err := a.build(ctx, t)
	if err != nil {
		return fabric.State{}, err
	}
	return d.snapshot(a.gen.Add(1)), nil
}

// programTimeout bounds one run: the caller that starts it may go away,
// and the others still wait for it.
const programTimeout = time.Minute

// Program applies a target's desired state as the store holds it at some
// moment after the call: a grant stored before the call is in what is
// applied when Program returns nil.
//
// changed names the host entries whose grants the caller changed (issued,
// renewed, moved, ended): only those are read from the store and sent to
// the target, as a delta, so the cost of a change does not grow with the
// hosts on the target. Without changed, the target's state is rebuilt
// whole from the store and sent whole (Reconcile, an agent connecting).
// The state is also rebuilt whole after an inventory change
// (InventoryChanged), for a change on a subsystem the state does not have,
// and after any failure; the target gets it whole when it has not
// acknowledged the state the delta applies to.
func (a *Agent) Program(ctx context.Context, targetID string, changed ...HostRef) error {
	t := a.target(targetID)
	t.mu.Lock()
	r := t.next
	if r == nil {
		r = &run{done: make(chan struct{}), refs: map[HostRef]bool{}}
		t.next = r
	}
	if len(changed) == 0 {
		r.full = true
	}
	for _, c := range changed {
		r.refs[c] = true
	}
	lead := !t.running
	t.running = true
	t.mu.Unlock()
	if lead {
		// This caller runs what is due until nothing is, on a context
		// that outlives it.
		go a.drain(context.WithoutCancel(ctx), targetID, t)
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// InventoryChanged says that a target's subsystems, namespaces or ports
// changed: its next programming run rebuilds its state whole from the
// store and sends it whole.
func (a *Agent) InventoryChanged(targetID string) {
	t := a.target(targetID)
	t.mu.Lock()
	t.stale = true
	t.mu.Unlock()
}

func (a *Agent) drain(ctx context.Context, targetID string, t *target) {
	for {
		t.mu.Lock()
		r := t.next
		t.next = nil
		if r == nil {
			t.running = false
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, programTimeout)
		r.err = a.programOnce(rctx, targetID, t, r)
		cancel()
		close(r.done)
	}
}

func (a *Agent) programOnce(ctx context.Context, targetID string, t *target, r *run) (err error) {
	t.mu.Lock()
	stale := t.stale
	t.stale = false
	t.mu.Unlock()
	defer func() {
		if err != nil {
			// Start over from the store: what the sink holds is unknown,
			// and a caller may put back what it stored (a renewal the
			// target did not take).
			t.state, t.synced = nil, false
		}
	}()
	tgt, err := a.Store.Target(ctx, targetID)
	if err != nil {
		return err
	}
	whole := r.full || stale || t.state == nil
	var changes []fabric.HostChange
	if !whole {
		if changes, whole, err = a.update(ctx, t.state, r.refs); err != nil {
			return fmt.Errorf("target %s: desired state: %w", targetID, err)
		}
	}
	if whole {
		if t.state, err = a.build(ctx, tgt); err != nil {
			return fmt.Errorf("target %s: desired state: %w", targetID, err)
		}
	}
	return a.send(ctx, tgt, t, whole, changes, whole)
}

// send brings the target's sink to t.state: the delta changes if the sink
// holds the state they apply to, else the whole state. A sink that turns
// out not to hold the delta's base (fabric.ErrNeedFull), or an agent that
// reconnected meanwhile, gets the whole state at once. fresh says t.state
// was just built whole from the store.
func (a *Agent) send(ctx context.Context, tgt *nvmegate.Target, t *target, whole bool, changes []fabric.HostChange, fresh bool) error {
	for retried := false; ; retried, fresh = true, false {
		sk, err := a.sinkOf(tgt)
		if err != nil {
			return err
		}
		moved := !t.synced || !sk.same(t.sink)
		whole = whole || moved
		if !whole && len(changes) == 0 {
			return nil // nothing changed, and the sink holds the state
		}
		whole = whole || !sk.deltas()
		if whole && moved && !fresh && sk.peers == nil {
			// A sink that holds nothing of ours, or the stream of an agent
			// that came from another replica: the state kept here may be
			// older than what that agent applied there (a replica keeps it
			// current only for its own changes while the agent streams
			// elsewhere), and would go out under a current revision. It is
			// read from the store again.
			if t.state, err = a.build(ctx, tgt); err != nil {
				return fmt.Errorf("target %s: desired state: %w", tgt.ID, err)
			}
		}
		gen := a.gen.Add(1)
		t.synced = false
		// Read after the state was read from the store: it holds no
		// change past this revision.
		rev := a.Store.Revision()
		if whole {
			err = sk.apply(ctx, a.Hub, Update{State: new(t.state.snapshot(gen)), Revision: rev})
		} else {
			err = sk.apply(ctx, a.Hub, Update{Delta: &fabric.Delta{Base: t.state.gen, Generation: gen, Hosts: changes}, Revision: rev})
		}
		// Namespaces the target cannot serve do not fail the generation:
		// it is applied otherwise (its hosts are on the target, removals
		// first), and those namespaces are not exported. The grants it
		// carries are answered; the operators are told (report).
		notServed, partial := fabric.NotServedIn(err)
		if partial {
			err = nil
			// A namespace the target could not take down is a removal
			// not done: the generation does not count as applied (a
			// crypto-erase waits for it, as for a host still allowed),
			// and the next run sends the whole state again.
			var stuck []string
			for _, n := range notServed {
				if n.Exported {
					stuck = append(stuck, n.String())
				}
			}
			if len(stuck) > 0 {
				more := ""
				if len(stuck) > 5 {
					stuck, more = stuck[:5], fmt.Sprintf(" (and %d more)", len(stuck)-5)
				}
				err = fmt.Errorf("namespaces still exported that the state takes down: %s%s", strings.Join(stuck, "; "), more)
			}
		}
		if err == nil {
			t.state.gen, t.sink, t.synced = gen, sk, true
			if whole && sk.peers == nil {
				// Only a whole state says what is served of every
				// namespace; another replica's agent reports there.
				a.report(tgt.ID, t.state, notServed)
			}
			return nil
		}
		if !retried && (errors.Is(err, fabric.ErrNeedFull) || errors.Is(err, errStreamEnded)) {
			whole = true
			continue
		}
		return fmt.Errorf("target %s: %w", tgt.ID, err)
	}
}

// NotServed returns, by target, the namespaces of the last whole state
// each target's sink took (on this replica) that are not served as the
// store says: those the target could not serve (no dm-crypt, cryptsetup
// refusing one; fabric.NotServedError), held as the target has them
// without exporting them, and those the gateway left out of the state
// because their data keys could not be had (see build). A target whose
// namespaces are all served is absent.
func (a *Agent) NotServed() map[string][]fabric.NotServed {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	out := make(map[string][]fabric.NotServed, len(a.notServed))
	for id, ns := range a.notServed {
		out[id] = slices.Clone(ns)
	}
	return out
}

// NotServedCount is how many namespaces NotServed lists, over all targets
// (the metric nvmegate_target_namespaces_not_served).
func (a *Agent) NotServedCount() int {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	n := 0
	for _, ns := range a.notServed {
		n += len(ns)
	}
	return n
}

// report records what a target's sink did not serve of whole state d:
// the namespaces the build left out, and those the sink reported, kept
// only if d has them (an agent reports on its own target's namespaces,
// and on nothing else). A change is logged; the same report again is not.
func (a *Agent) report(targetID string, d *desired, reported []fabric.NotServed) {
	ns := slices.Clone(d.leftOut)
	for _, n := range reported {
		ss := d.subs[n.Subsystem]
		if ss == nil || !slices.ContainsFunc(ss.Namespaces, func(x fabric.Namespace) bool { return x.NSID == n.NSID }) {
			a.log().Warn("target agent reported a namespace not served that its state does not have; ignored",
				"target", targetID, "subsystem", n.Subsystem, "nsid", n.NSID)
			continue
		}
		ns = append(ns, n)
	}
	slices.SortFunc(ns, func(x, y fabric.NotServed) int {
		return cmp.Or(strings.Compare(x.Subsystem, y.Subsystem), cmp.Compare(x.NSID, y.NSID), strings.Compare(x.Reason, y.Reason))
	})
	ns = slices.CompactFunc(ns, func(x, y fabric.NotServed) bool { return x.Subsystem == y.Subsystem && x.NSID == y.NSID })
	a.nsMu.Lock()
	prev := a.notServed[targetID]
	if len(ns) == 0 {
		delete(a.notServed, targetID)
	} else {
		if a.notServed == nil {
			a.notServed = map[string][]fabric.NotServed{}
		}
		a.notServed[targetID] = ns
	}
	a.nsMu.Unlock()
	if slices.Equal(prev, ns) {
		return
	}
	for _, n := range ns {
		a.log().Error("namespace not served: the rest of its target is programmed; it is not exported (never in the clear) until the cause is fixed",
			"target", targetID, "subsystem", n.Subsystem, "nsid", n.NSID, "reason", n.Reason)
	}
	if len(ns) == 0 {
		a.log().Info("every namespace of the target is served again", "target", targetID)
	}
}

// Peers relays the programming of targets between gateway replicas.
type Peers interface {
	// Await waits until the agent of target, on whichever replica it
	// streams from, has acknowledged the store's state as of this
	// replica's current revision or later: the replica it is attached to
	// programs it from the shared store.
	Await(ctx context.Context, target string) error
}

// sink is where a target's state goes: its own agent's stream, a local
// driver, or the replica its agent streams from.
type sink struct {
	remote *remote
	driver Driver
	peers  Peers // with target: programmed by the replica it streams from
	target string
	// attached, with peers, is closed when the target's agent attaches
	// here: a wait for another replica's agent ends, and the state goes
	// to the stream here.
	attached <-chan struct{}
}

func (a *Agent) sinkOf(t *nvmegate.Target) (sink, error) {
	if a.Hub != nil {
		if r := a.Hub.get(t.ID); r != nil {
			return sink{remote: r}, nil
		}
	}
	var d Driver
	if a.Driver != nil {
		d = a.Driver(t)
	}
	if d == nil {
		if a.Peers != nil {
			var attached <-chan struct{}
			if a.Hub != nil {
				// The signal, then a second look: an agent attaching
				// after the first is heard of either way.
				attached = a.Hub.attaching(t.ID)
				if r := a.Hub.get(t.ID); r != nil {
					return sink{remote: r}, nil
				}
			}
			return sink{peers: a.Peers, target: t.ID, attached: attached}, nil
		}
		return sink{}, fmt.Errorf("target %s (driver %s): %w", t.ID, t.Driver, ErrNotManaged)
	}
	return sink{driver: d}, nil
}

// same reports whether s is o (a driver of a type that cannot be compared
// is never the same: it gets whole states).
func (s sink) same(o sink) bool {
	if s.peers != nil || o.peers != nil {
		return false // another replica's: it sends its own states
	}
	if s.remote != nil || o.remote != nil {
		return s.remote == o.remote
	}
	if s.driver == nil || o.driver == nil || !reflect.TypeOf(s.driver).Comparable() {
		return false
	}
	return s.driver == o.driver
}

// deltas reports whether the sink takes deltas (an agent from before
// deltas does not).
func (s sink) deltas() bool { return s.peers == nil && (s.remote == nil || s.remote.deltas) }

func (s sink) apply(ctx context.Context, h *Hub, u Update) error {
	switch {
	case s.peers != nil:
		return s.await(ctx)
	case s.remote != nil:
		return h.push(ctx, s.remote, u)
	case u.Delta != nil:
		return s.driver.ApplyDelta(ctx, *u.Delta)
	default:
		return s.driver.Apply(ctx, *u.State)
	}
}

// await waits for the agent of s.target on another replica to
// acknowledge, or for the agent to attach here: an agent that left a
// hung replica for this one gets the state on its stream at once, rather
// than after the wait for the replica it left runs out (errStreamEnded:
// send starts over, whole, with the new sink).
func (s sink) await(ctx context.Context) error {
	if s.attached == nil {
		return s.peers.Await(ctx, s.target)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.attached:
			cancel(errAttachedHere)
		case <-ctx.Done():
		}
	}()
	err := s.peers.Await(ctx, s.target)
	if errors.Is(context.Cause(ctx), errAttachedHere) {
		return fmt.Errorf("%w: %w", errStreamEnded, errAttachedHere)
	}
	return err
}

var errAttachedHere = errors.New("targetagent: the target's agent attached to this replica")

// ErrLocalTarget refuses a remote agent's stream for a target this agent
// programs with its own driver: a target has one way of being programmed,
// chosen by configuration, not by whoever connects first.
var ErrLocalTarget = errors.New("targetagent: the gateway programs this target with its own driver; it takes no remote agent")

// Subscribe connects the remote agent of target t (Hub.Subscribe): only a
// target without a local driver takes one, and only one stream at a time.
func (a *Agent) Subscribe(t *nvmegate.Target, deltas bool) (*Subscription, error) {
	if a.Hub == nil {
		return nil, fmt.Errorf("target %s: %w", t.ID, ErrLocalTarget)
	}
	if a.Driver != nil && a.Driver(t) != nil {
		return nil, fmt.Errorf("target %s: %w", t.ID, ErrLocalTarget)
	}
	return a.Hub.Subscribe(t.ID, deltas)
}

// Ack records a remote agent's acknowledgement (Hub.Ack).
func (a *Agent) Ack(targetID, stream string, gen uint64, errMsg string, notServed ...fabric.NotServed) error {
	if a.Hub == nil {
		return fmt.Errorf("%w: target %s", ErrNotLiveStream, targetID)
	}
	return a.Hub.Ack(targetID, stream, gen, errMsg, notServed...)
}

// Live reports whether stream is targetID's live agent stream.
func (a *Agent) Live(targetID, stream string) bool {
	return a.Hub != nil && a.Hub.Live(targetID, stream)
}

// Reconcile programs every target whole (at start, and periodically:
// grants expire and roots pass their grace without anyone calling).
func (a *Agent) Reconcile(ctx context.Context) error {
	ts, err := store.All(func(p store.Page) ([]*nvmegate.Target, string, error) {
		return a.Store.ListTargets(ctx, store.TargetFilter{}, p)
	})
	if err != nil {
		return err
	}
	var errs []error
	here := map[string]bool{} // the targets programmed here
	for _, t := range ts {
		if sk, err := a.sinkOf(t); err == nil && sk.peers != nil {
			continue // its agent streams from another replica, which reconciles it
		}
		here[t.ID] = true
		if err := a.Program(ctx, t.ID); err != nil && !errors.Is(err, ErrNotManaged) {
			errs = append(errs, err)
		}
	}
	// What this replica reported of a target removed, or now programmed
	// by another replica, is no longer its to report.
	a.nsMu.Lock()
	for id := range a.notServed {
		if !here[id] {
			delete(a.notServed, id)
		}
	}
	a.nsMu.Unlock()
	return errors.Join(errs...)
}
