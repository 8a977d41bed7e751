package targetagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
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
	SubsystemGrants(ctx context.Context, subsystemNQN string) ([]*nvmegate.Grant, error)
}

// Credentials derives a grant's credentials.
type Credentials interface {
	CredentialsAt(ctx context.Context, hostNQN, subNQN string, version uint64, p keys.CredentialParams) (keys.Credentials, error)
}

// Agent programs targets through their drivers.
type Agent struct {
	Store Store
	Keys  Credentials
	// Driver returns the driver of a target (nil: the target is not
	// programmed by this agent, and Program fails with ErrNotManaged).
	Driver func(t *nvmegate.Target) fabric.Driver
	Now    func() time.Time
	Log    *slog.Logger
	// Hub, if set, connects remote agents: a target whose agent is
	// connected is programmed through it, not by a local driver.
	Hub *Hub

	mu      sync.Mutex
	targets map[string]*targetRuns
	gen     uint64
}

// targetRuns coalesces the Program calls of one target: one run at a time,
// and every call made while a run is going is answered by the next run,
// which reads the store after all of them were made. Under a connect storm
// one Apply of the target's whole state then serves every waiting connect
// instead of one each (the state and the Apply are O(hosts)).
type targetRuns struct {
	mu      sync.Mutex
	running bool
	next    *run // the run the next callers wait for; nil if none is due
}

type run struct {
	done chan struct{}
	err  error
}

func (a *Agent) runs(id string) *targetRuns {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.targets == nil {
		a.targets = map[string]*targetRuns{}
	}
	t := a.targets[id]
	if t == nil {
		t = &targetRuns{}
		a.targets[id] = t
	}
	return t
}

// GrantParams are the credential parameters a grant was issued with.
func GrantParams(g *nvmegate.Grant) (keys.CredentialParams, error) {
	h, err := nvmefmt.ParseHash(g.DHCHAPHash)
	if err != nil {
		return keys.CredentialParams{}, err
	}
	p := keys.CredentialParams{DHCHAPHash: h, Bidirectional: g.Bidirectional}
	if g.TLS {
		p.TLSHash = nvmefmt.SHA256
		if h == nvmefmt.SHA384 || h == nvmefmt.SHA512 {
			p.TLSHash = nvmefmt.SHA384
		}
	}
	return p, nil
}

// State builds the desired state of a target from the store.
func (a *Agent) State(ctx context.Context, t *nvmegate.Target) (fabric.State, error) {
	now := time.Now()
	if a.Now != nil {
		now = a.Now()
	}
	subs, err := store.All(func(p store.Page) ([]*nvmegate.Subsystem, string, error) {
		return a.Store.ListSubsystems(ctx, store.SubsystemFilter{TargetID: t.ID}, p)
	})
	if err != nil {
		return fabric.State{}, err
	}
	var st fabric.State
	for _, sub := range subs {
		fs := fabric.Subsystem{NQN: sub.NQN}
		for _, pid := range sub.PortIDs {
			for _, p := range t.Ports {
				if p.ID == pid {
					fs.Ports = append(fs.Ports, port(p))
				}
			}
		}
		nss, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
			return a.Store.ListNamespaces(ctx, store.NamespaceFilter{SubsystemNQN: sub.NQN}, p)
		})
		if err != nil {
			return fabric.State{}, err
		}
		for _, n := range nss {
			fs.Namespaces = append(fs.Namespaces, fabric.Namespace{NSID: n.NSID, MaxIOPS: n.QoS.MaxIOPS, MaxMBps: n.QoS.MaxMBps})
		}
		grants, err := a.Store.SubsystemGrants(ctx, sub.NQN)
		if err != nil {
			return fabric.State{}, err
		}
		// The newest active grant of each host decides its keys.
		newest := map[string]*nvmegate.Grant{}
		for _, g := range grants {
			if !g.Active(now) {
				continue
			}
			if cur := newest[g.HostNQN]; cur == nil || g.IssuedAt.After(cur.IssuedAt) {
				newest[g.HostNQN] = g
			}
		}
		for _, g := range newest {
			p, err := GrantParams(g)
			if err != nil {
				return fabric.State{}, err
			}
			c, err := a.Keys.CredentialsAt(ctx, g.HostNQN, g.Scope(), g.KeyVersion, p)
			if errors.Is(err, keys.ErrExpired) {
				continue // its root is past the grace: the host is no longer allowed
			}
			if err != nil {
				return fabric.State{}, err
			}
			h := fabric.Host{NQN: g.HostNQN, DHCHAPKey: c.HostSecret, DHCHAPCtrlKey: c.CtrlSecret, TLSPSK: c.TLSPSK}
			if c.HostSecret != "" {
				h.DHCHAPHash, h.DHCHAPGroup = fabric.Hash(g.DHCHAPHash), g.DHGroup
			}
			fs.Hosts = append(fs.Hosts, h)
		}
		st.Subsystems = append(st.Subsystems, fs)
	}
	a.mu.Lock()
	a.gen++
	st.Generation = a.gen
	a.mu.Unlock()
	st.Normalize()
	return st, nil
}

func port(p nvmegate.Port) fabric.Port {
	fp := fabric.Port{ID: p.ID, Trtype: p.Transport, Adrfam: p.AddressFamily, Traddr: p.Address, Trsvcid: p.ServiceID, Treq: "not required"}
	if p.Transport == nvmegate.TransportTCP {
		fp.Tsas = "none"
		if p.TLS() {
			fp.Tsas = "tls1.3"
		}
	}
	if p.SecureChannel == nvmegate.SecureChannelRequired {
		fp.Treq = "required"
	}
	return fp
}

// programTimeout bounds one run: the caller that starts it may go away,
// and the others still wait for it.
const programTimeout = time.Minute

// Program applies a target's desired state with its driver, as the store
// holds it at some moment after the call: a grant stored before the call
// is in what is applied when Program returns nil.
func (a *Agent) Program(ctx context.Context, targetID string) error {
	t := a.runs(targetID)
	t.mu.Lock()
	r := t.next
	if r == nil {
		r = &run{done: make(chan struct{})}
		t.next = r
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

func (a *Agent) drain(ctx context.Context, targetID string, t *targetRuns) {
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
		r.err = a.programOnce(rctx, targetID)
		cancel()
		close(r.done)
	}
}

func (a *Agent) programOnce(ctx context.Context, targetID string) error {
	t, err := a.Store.Target(ctx, targetID)
	if err != nil {
		return err
	}
	st, err := a.State(ctx, t)
	if err != nil {
		return fmt.Errorf("target %s: desired state: %w", targetID, err)
	}
	if a.Hub != nil && a.Hub.Connected(targetID) {
		return a.Hub.Push(ctx, targetID, st)
	}
	var d fabric.Driver
	if a.Driver != nil {
		d = a.Driver(t)
	}
	if d == nil {
		return fmt.Errorf("target %s (driver %s): %w", targetID, t.Driver, ErrNotManaged)
	}
	if err := d.Apply(ctx, st); err != nil {
		return fmt.Errorf("target %s: %w", targetID, err)
	}
	return nil
}

// Reconcile programs every target (at start, and periodically: grants
// expire and roots pass their grace without anyone calling).
func (a *Agent) Reconcile(ctx context.Context) error {
	ts, err := store.All(func(p store.Page) ([]*nvmegate.Target, string, error) {
		return a.Store.ListTargets(ctx, store.TargetFilter{}, p)
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range ts {
		if err := a.Program(ctx, t.ID); err != nil && !errors.Is(err, ErrNotManaged) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
