package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

// policyScope is the resource of a connect or renew, typed, for the policy
// engine (authz.Input.Scope): the records scopeResource would put in the
// resource map, handed over without building the map (describe builds
// none for such a call: typedCall). Nil for any other call.
func policyScope(ctx context.Context) *authz.Scope {
	sc, ok := scopeFrom(ctx)
	if !ok || !typedCall(sc) {
		return nil
	}
	return authzScope(sc)
}

// typedCall reports whether policy gets sc typed (policyScope), not as a
// map: a call about a subsystem, whose resource authz.Scope describes.
func typedCall(sc *nvmegate.Scope) bool { return sc.SubsystemNQN != "" }

// authzScope is sc as policy sees it: field for field scopeResource(sc).
func authzScope(sc *nvmegate.Scope) *authz.Scope {
	out := &authz.Scope{Kind: "job", Tenant: sc.Tenant(), Job: authz.ScopeJob{ID: sc.JobID},
		Binding:   authz.ScopeBinding{SPIFFEID: sc.Binding.SPIFFEID, HostNQN: sc.Binding.HostNQN, Tenant: sc.Binding.Tenant, Bound: sc.Bound},
		Request:   authz.ScopeRequest{HostNQN: sc.HostNQN, TTL: sc.TTL},
		Subsystem: authz.ScopeSubsystem{NQN: sc.SubsystemNQN}}
	if j := sc.Job; j != nil {
		out.Job = authz.ScopeJob{ID: j.ID, Found: true, Tenant: j.Tenant, Scheduler: j.Scheduler,
			AllowedRegions: j.AllowedRegions, ExpiresAt: j.ExpiresAt, State: j.State}
		if sc.Member {
			// As scopeResource: the caller alone, not the job's node list.
			out.Job.Nodes = []string{sc.Caller}
		}
	}
	if s := sc.Subsystem; s != nil {
		out.Subsystem = authz.ScopeSubsystem{NQN: s.NQN, Found: true, Tenant: s.Tenant, TargetID: s.TargetID, DHCHAP: s.DHCHAP, TLS: s.TLS}
		if t := sc.Target; t != nil {
			out.Target = &authz.ScopeTarget{ID: t.ID, Region: t.Region, Fabric: t.Fabric, Driver: t.Driver}
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
