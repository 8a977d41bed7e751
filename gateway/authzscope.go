package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

// policyScope is the typed scope of a connect or renew for the policy
// engine (authz.Input.Scope): the same records scopeResource puts in the
// resource map, handed over without building and walking maps. Nil for
// any other call.
func policyScope(ctx context.Context) *authz.Scope {
	sc, ok := scopeFrom(ctx)
	if !ok || sc.SubsystemNQN == "" {
		return nil
	}
	return authzScope(sc)
}

func authzScope(sc *nvmegate.Scope) *authz.Scope {
	out := &authz.Scope{Tenant: sc.Tenant(), Job: authz.ScopeJob{ID: sc.JobID},
		Subsystem: authz.ScopeSubsystem{NQN: sc.SubsystemNQN}}
	if j := sc.Job; j != nil {
		out.Job = authz.ScopeJob{ID: j.ID, Found: true, Tenant: j.Tenant, AllowedRegions: j.AllowedRegions}
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
