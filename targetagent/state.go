package targetagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// desired is a target's desired state as the agent keeps it: built whole
// from the store, then changed one host entry at a time.
type desired struct {
	gen  uint64 // the generation last sent
	subs map[string]*subState
	// leftOut are the namespaces of the store the state does not have:
	// their data keys could not be had (build).
	leftOut []fabric.NotServed
}

// subState is one subsystem: its ports and namespaces, and its host
// entries.
type subState struct {
	fabric.Subsystem // its Hosts are not kept here: entries has them
	entries          map[string]*entry
}

// entry is one host on one subsystem: the grant that decides it — the
// newest active grant of that host there — with the credentials derived
// for it, and the nodes holding the entry's active grants (a change reads
// theirs, not the subsystem's).
type entry struct {
	grant   string
	host    fabric.Host
	allowed bool // false: the deciding grant's root is past its grace
	nodes   []string
}

// newer orders grants newest first, then by ID: the first decides.
func newer(a, b *nvmegate.Grant) int {
	if c := b.IssuedAt.Compare(a.IssuedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// build reads a target's whole desired state from the store: every
// subsystem of the target with its ports and namespaces, and an entry for
// every host of its active, unexpired grants.
func (a *Agent) build(ctx context.Context, t *nvmegate.Target) (*desired, error) {
	now := a.now()
	subs, err := store.All(func(p store.Page) ([]*nvmegate.Subsystem, string, error) {
		return a.Store.ListSubsystems(ctx, store.SubsystemFilter{TargetID: t.ID}, p)
	})
	if err != nil {
		return nil, err
	}
	d := &desired{subs: make(map[string]*subState, len(subs))}
	for _, sub := range subs {
		ss := &subState{Subsystem: fabric.Subsystem{NQN: sub.NQN}, entries: map[string]*entry{}}
		for _, pid := range sub.PortIDs {
			for _, p := range t.Ports {
				if p.ID == pid {
					ss.Ports = append(ss.Ports, port(p))
				}
			}
		}
		slices.SortFunc(ss.Ports, func(a, b fabric.Port) int { return cmp.Compare(a.ID, b.ID) })
		nss, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
			return a.Store.ListNamespaces(ctx, store.NamespaceFilter{SubsystemNQN: sub.NQN}, p)
		})
		if err != nil {
			return nil, err
		}
		for _, n := range nss {
			fn := fabric.Namespace{NSID: n.NSID, MaxIOPS: n.QoS.MaxIOPS, MaxMBps: n.QoS.MaxMBps, BackingDevice: n.BackingDevice}
			if n.BackingDevice != "" {
				// Only a namespace of this target's own subsystems, only
				// into the state of this target: its agent's stream.
				k, err := a.Keys.NamespaceKeys(ctx, n.Key().KeyName(), n.Incarnation)
				switch {
				case err == nil:
					fn.DataKey = k.Key
					if k.Next != nil {
						fn.NextDataKey, fn.NextGeneration = k.Next, k.NextWrapped.Gen()
					}
				case errors.Is(err, keys.ErrUnavailable):
					// The key store is away (past the manager's
					// MaxStaleness): held, without a key. The target keeps
					// it as it is — exported through the mapping it has,
					// or not at all — never opened anew. Leaving it out
					// would tell the target to take down a namespace it
					// serves, for a blip of the key store; and nothing is
					// given that the target does not already hold.
					a.log().WarnContext(ctx, "namespace held as its target has it: its data key cannot be read now",
						"target", t.ID, "subsystem", n.SubsystemNQN, "nsid", n.NSID, "err", err)
				default:
					// The key store answered, and there is no key to give:
					// another record's key (keys.ErrForeign), none, or one
					// that cannot be unwrapped. Left out of the state, so
					// the target takes it down if it exports it (holding
					// it would keep serving what another record's key
					// opened), and the rest of the target is programmed.
					a.log().ErrorContext(ctx, "namespace left out of its target's state: its data key cannot be had",
						"target", t.ID, "subsystem", n.SubsystemNQN, "nsid", n.NSID, "err", err)
					d.leftOut = append(d.leftOut, fabric.NotServed{Subsystem: n.SubsystemNQN, NSID: n.NSID,
						Reason: fmt.Sprintf("left out of the target's state: its data key cannot be had (%v)", err)})
					continue
				}
			}
			ss.Namespaces = append(ss.Namespaces, fn)
		}
		grants, err := a.Store.SubsystemGrants(ctx, sub.NQN)
		if err != nil {
			return nil, err
		}
		byHost := map[string][]*nvmegate.Grant{}
		for _, g := range grants {
			if g.Active(now) {
				byHost[g.HostNQN] = append(byHost[g.HostNQN], g)
			}
		}
		for host, gs := range byHost {
			if ss.entries[host], err = a.entry(ctx, gs); err != nil {
				return nil, err
			}
		}
		d.subs[sub.NQN] = ss
	}
	return d, nil
}

// entry makes the host entry decided by gs, the active grants of one host
// on one subsystem (at least one).
func (a *Agent) entry(ctx context.Context, gs []*nvmegate.Grant) (*entry, error) {
	g := slices.MinFunc(gs, newer)
	e := &entry{grant: g.ID}
	for _, o := range gs {
		if !slices.Contains(e.nodes, o.Node) {
			e.nodes = append(e.nodes, o.Node)
		}
	}
	p, err := GrantParams(g)
	if err != nil {
		return nil, err
	}
	c, err := a.Keys.CredentialsAt(ctx, g.HostNQN, g.Scope(), g.KeyVersion, p)
	if errors.Is(err, keys.ErrExpired) {
		return e, nil // its root is past the grace: the host is no longer allowed
	}
	if err != nil {
		return nil, err
	}
	e.allowed = true
	e.host = fabric.Host{NQN: g.HostNQN, DHCHAPKey: c.HostSecret, DHCHAPCtrlKey: c.CtrlSecret, TLSPSK: c.TLSPSK}
	if c.HostSecret != "" {
		e.host.DHCHAPHash, e.host.DHCHAPGroup = fabric.Hash(g.DHCHAPHash), g.DHGroup
	}
	return e, nil
}

// hostKey is one host entry.
type hostKey struct{ sub, host string }

// update recomputes the host entries refs name from the store and returns
// how they changed; whole says the state must be rebuilt instead (a
// change on a subsystem it does not have: the inventory changed).
//
// With a host, its entries on the target's other subsystems are looked at
// too: on nvmet they are one hosts/ entry, and their grants move together
// (and a grant among them may have passed its root's grace since it was
// read). Each entry is recomputed from the active grants of the nodes
// holding it — the node of the change and those known to hold it — so no
// read grows with the hosts on the target; a change with no node falls
// back to the subsystem's grants.
func (a *Agent) update(ctx context.Context, d *desired, refs map[HostRef]bool) (changes []fabric.HostChange, whole bool, err error) {
	now := a.now()
	nodes := map[string]map[string]bool{} // host → the nodes whose grants to read
	entries := map[hostKey]bool{}
	for r := range refs {
		if d.subs[r.SubsystemNQN] == nil {
			return nil, true, nil
		}
		if nodes[r.HostNQN] == nil {
			nodes[r.HostNQN] = map[string]bool{}
		}
		nodes[r.HostNQN][r.Node] = true
		entries[hostKey{r.SubsystemNQN, r.HostNQN}] = true
	}
	for host, ns := range nodes {
		for sub, ss := range d.subs {
			if e := ss.entries[host]; e != nil {
				entries[hostKey{sub, host}] = true
				for _, n := range e.nodes {
					ns[n] = true
				}
			}
		}
	}
	byNode := map[string][]*nvmegate.Grant{}
	bySub := map[string][]*nvmegate.Grant{}
	order := slices.SortedFunc(maps.Keys(entries), func(x, y hostKey) int {
		return cmp.Or(strings.Compare(x.sub, y.sub), strings.Compare(x.host, y.host))
	})
	for _, k := range order {
		var gs []*nvmegate.Grant
		add := func(from []*nvmegate.Grant) {
			for _, g := range from {
				if g.SubsystemNQN == k.sub && g.HostNQN == k.host && g.Active(now) &&
					!slices.ContainsFunc(gs, func(o *nvmegate.Grant) bool { return o.ID == g.ID }) {
					gs = append(gs, g)
				}
			}
		}
		for n := range nodes[k.host] {
			if n == "" {
				if _, ok := bySub[k.sub]; !ok {
					if bySub[k.sub], err = a.Store.SubsystemGrants(ctx, k.sub); err != nil {
						return nil, false, err
					}
				}
				add(bySub[k.sub])
				continue
			}
			if _, ok := byNode[n]; !ok {
				if byNode[n], err = a.Store.NodeActiveGrants(ctx, n); err != nil {
					return nil, false, err
				}
			}
			add(byNode[n])
		}
		ss := d.subs[k.sub]
		old := ss.entries[k.host]
		var e *entry
		if len(gs) > 0 {
			if e, err = a.entry(ctx, gs); err != nil {
				return nil, false, err
			}
			ss.entries[k.host] = e
		} else {
			delete(ss.entries, k.host)
		}
		was, is := old != nil && old.allowed, e != nil && e.allowed
		switch {
		case was && !is:
			changes = append(changes, fabric.HostChange{Subsystem: k.sub, Host: fabric.Host{NQN: k.host}, Remove: true})
		case is && (!was || old.host != e.host):
			changes = append(changes, fabric.HostChange{Subsystem: k.sub, Host: e.host})
		}
	}
	return changes, false, nil
}

// snapshot is the whole state at generation gen.
func (d *desired) snapshot(gen uint64) fabric.State {
	st := fabric.State{Generation: gen, Subsystems: make([]fabric.Subsystem, 0, len(d.subs))}
	for _, ss := range d.subs {
		fs := fabric.Subsystem{NQN: ss.NQN, Ports: slices.Clone(ss.Ports), Namespaces: slices.Clone(ss.Namespaces)}
		for _, e := range ss.entries {
			if e.allowed {
				fs.Hosts = append(fs.Hosts, e.host)
			}
		}
		st.Subsystems = append(st.Subsystems, fs)
	}
	st.Normalize()
	return st
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
