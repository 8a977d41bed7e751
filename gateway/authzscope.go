package gateway

import (
	"context"
	"sync"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

// policyScope is the resource of a connect or renew, typed, for the policy
// engine (authz.Input.Scope): the records scopeResource would put in the
// resource map, handed over without building the map (describe builds
// none for such a call: typedCall). Nil for any other call. A scope
// describe read at one store revision comes sealed (sealedScopes).
func (s *Server) policyScope(ctx context.Context) *authz.Scope {
	slot, _ := ctx.Value(scopeKey{}).(*scopeSlot)
	if slot == nil || slot.scope == nil || !typedCall(slot.scope) {
		return nil
	}
	if slot.rev == 0 { // not read at one known revision
		return authzScope(slot.scope)
	}
	return s.scopes.scope(slot.scope, slot.rev)
}

// ScopeRevisions reports the revision of the records a scope is read from
// (store.DB.ScopeRevision): inventory, bindings and jobs.
type ScopeRevisions interface {
	ScopeRevision() uint64
}

// sealedScopes keeps, per job, subsystem and store revision, the typed
// scope of a subsystem call sealed (authz.Scope.Sealed), so that the
// thousands of nodes of a job connecting to a subsystem share one
// encoding of its namespaces, subsystem and job instead of each call
// hashing them anew. The scope part of a template is a function of the
// records at that revision alone (describe read them all at it: the
// revision did not move while it read), so a template is exact for every
// call read at the same revision; each call gets a copy with its own
// caller fields. A new revision is a new key: nothing is invalidated.
type sealedScopes struct {
	mu sync.RWMutex
	m  map[sealedKey]*authz.Scope
}

type sealedKey struct {
	job, subsystem string
	rev            uint64
}

// maxSealedScopes bounds the templates kept; past it the map starts over
// (the jobs connecting now seal theirs again).
const maxSealedScopes = 4096

// scope is sc as authzScope makes it, its scope part sealed: sc was read
// at store revision rev.
func (c *sealedScopes) scope(sc *nvmegate.Scope, rev uint64) *authz.Scope {
	k := sealedKey{sc.JobID, sc.SubsystemNQN, rev}
	c.mu.RLock()
	t := c.m[k]
	c.mu.RUnlock()
	if t == nil {
		t = authzScope(sc).Sealed()
		c.mu.Lock()
		if len(c.m) >= maxSealedScopes {
			clear(c.m)
		}
		c.m[k] = t
		c.mu.Unlock()
	}
	out := *t
	setCallerFields(&out, sc)
	return &out
}

// typedCall reports whether policy gets sc typed (policyScope), not as a
// map: a call about a subsystem, whose resource authz.Scope describes.
func typedCall(sc *nvmegate.Scope) bool { return sc.SubsystemNQN != "" }

// authzScope is sc as policy sees it: field for field scopeResource(sc).
func authzScope(sc *nvmegate.Scope) *authz.Scope {
	out := &authz.Scope{Kind: "job", Tenant: sc.Tenant(), Job: authz.ScopeJob{ID: sc.JobID},
		Subsystem: authz.ScopeSubsystem{NQN: sc.SubsystemNQN}}
	if j := sc.Job; j != nil {
		out.Job = authz.ScopeJob{ID: j.ID, Found: true, Tenant: j.Tenant, Scheduler: j.Scheduler,
			AllowedRegions: j.AllowedRegions, ExpiresAt: j.ExpiresAt, State: j.State}
	}
	setCallerFields(out, sc)
	if s := sc.Subsystem; s != nil {
		out.Subsystem = authz.ScopeSubsystem{NQN: s.NQN, Found: true, Tenant: s.Tenant, TargetID: s.TargetID, DHCHAP: s.DHCHAP, TLS: s.TLS}
		if t := sc.Target; t != nil {
			out.Target = &authz.ScopeTarget{ID: t.ID, Region: t.Region, Fabric: t.Fabric, Driver: t.Driver}
			out.Ports = []authz.ScopePort{}
			for _, p := range subsystemPorts(s, t) {
				out.Ports = append(out.Ports, authz.ScopePort{ID: p.ID, Subnet: p.Subnet})
			}
		}
	}
	out.Namespaces = make([]authz.ScopeNamespace, len(sc.Namespaces))
	for i, n := range sc.Namespaces {
		an := authz.ScopeNamespace{SubsystemNQN: n.Key.SubsystemNQN, NSID: n.Key.NSID, Mode: n.Mode}
		if ns := n.Namespace; ns != nil {
			// As namespaceValueAt: the record's key.
			an.SubsystemNQN, an.NSID = ns.SubsystemNQN, ns.NSID
			an.Found, an.Tenant, an.Region, an.DataClass = true, ns.Tenant, ns.Region, ns.DataClass
			an.DatasetName, an.DatasetDigest, an.MaxIOPS, an.MaxMBps = ns.Dataset.Name, ns.Dataset.Digest, ns.QoS.MaxIOPS, ns.QoS.MaxMBps
			if t := n.Target; t != nil {
				an.Placed, an.Target = true, authz.ScopePlacement{ID: t.ID, Region: t.Region, Fabric: t.Fabric}
			}
		}
		out.Namespaces[i] = an
	}
	return out
}

// setCallerFields sets what out holds of sc's caller: the binding, the
// request's host NQN and TTL, the job's nodes as policy sees them — as
// scopeResource, the caller alone if it is a member, not the job's node
// list — and the job's state as this call read it (an active job reads as
// expired once its expiry passes, with no new store revision). None of it
// is in a sealed scope part.
func setCallerFields(out *authz.Scope, sc *nvmegate.Scope) {
	out.Binding = authz.ScopeBinding{SPIFFEID: sc.Binding.SPIFFEID, HostNQN: sc.Binding.HostNQN, Tenant: sc.Binding.Tenant, Bound: sc.Bound,
		Subnets: subnetsOf(&sc.Binding)}
	out.Request.HostNQN, out.Request.TTL = sc.HostNQN, sc.TTL
	out.Job.Nodes = nil
	if sc.Job != nil {
		out.Job.State = sc.Job.State
		if sc.Member {
			out.Job.Nodes = []string{sc.Caller}
		}
	}
}

// subnetsOf is a binding's segment as policy sees it: never nil (a binding
// without a segment has subnets []).
func subnetsOf(b *nvmegate.HostBinding) []string {
	if b.Subnets == nil {
		return []string{}
	}
	return b.Subnets
}

// subsystemPorts are the ports of target t that subsystem sub listens on,
// in the subsystem's order.
func subsystemPorts(sub *nvmegate.Subsystem, t *nvmegate.Target) []nvmegate.Port {
	var out []nvmegate.Port
	for _, id := range sub.PortIDs {
		if p, ok := t.Port(id); ok {
			out = append(out, p)
		}
	}
	return out
}
