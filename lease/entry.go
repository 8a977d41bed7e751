package lease

import (
	"strings"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// Every audit entry of the lifecycle is built here, from typed values: the
// call's scope and decision, the grant, the versions and fingerprints of
// what was issued — never the secrets.

// The actions of the node calls whose grants the lifecycle records, as
// policy names them (authz.ActionFromMethod).
const (
	actionConnect = "access.connect"
	actionRenew   = "access.renew"
)

// ScopeEntry is the entry of a node's call about sc, decided by d: the
// caller, the job with its tenant and expiry, the caller's host NQN, the
// subsystem and the namespaces with their modes and datasets, the
// decision; Detail is the action and the job ID. It is field for field
// what the gateway records for a call from the policy input it builds of
// the same scope.
func ScopeEntry(kind audit.EventKind, action string, sc *nvmegate.Scope, d *nvmegate.Decision) audit.Entry {
	e := audit.Entry{Kind: kind, Caller: sc.Caller, Tenant: sc.Tenant(), JobID: sc.JobID, HostNQN: sc.Binding.HostNQN, Detail: action}
	if sc.Job != nil {
		e.JobID, e.ExpiresAt = sc.Job.ID, sc.Job.ExpiresAt.UTC()
	}
	if sc.SubsystemNQN != "" {
		e.SubsystemNQN = sc.SubsystemNQN
		if sc.Subsystem != nil {
			e.SubsystemNQN = sc.Subsystem.NQN
		}
	}
	if e.Tenant == "" {
		// No job (or one without a tenant): the subsystem's, else the
		// binding's.
		if sc.SubsystemNQN != "" && sc.Subsystem != nil {
			e.Tenant = sc.Subsystem.Tenant
		}
		if e.Tenant == "" {
			e.Tenant = sc.Binding.Tenant
		}
	}
	for _, n := range sc.Namespaces {
		ns := audit.Namespace{SubsystemNQN: n.Key.SubsystemNQN, NSID: n.Key.NSID, Mode: n.Mode}
		if n.Namespace != nil {
			ns.SubsystemNQN, ns.NSID = n.Namespace.SubsystemNQN, n.Namespace.NSID
			ns.Dataset, ns.DatasetDigest = n.Namespace.Dataset.Name, n.Namespace.Dataset.Digest
		}
		if ns.NSID == 0 {
			continue
		}
		e.Namespaces = append(e.Namespaces, ns)
	}
	if e.JobID != "" {
		e.Detail += " " + e.JobID
	}
	if d != nil {
		e.Decision = &audit.Decision{Allow: d.Allow, ID: d.ID, PolicyRevision: d.PolicyRevision, Reasons: d.Reasons}
	}
	return e
}

// grantEntry is the entry of a grant issued (kind grant) or renewed (kind
// renew) at time at: the call's scope, the grant, and the versions and
// fingerprints of what was issued; Detail names the node's earlier
// grants it supersedes (as read before its commit, which ends them) and
// the grants that move with it.
func grantEntry(kind audit.EventKind, action string, sc *nvmegate.Scope, d *nvmegate.Decision, g *nvmegate.Grant,
	c keys.Credentials, superseded, moving []*nvmegate.Grant, at time.Time) audit.Entry {
	e := ScopeEntry(kind, action, sc, d)
	e.Time, e.GrantID, e.ExpiresAt, e.HostNQN, e.SubsystemNQN = at, g.ID, g.ExpiresAt, g.HostNQN, g.SubsystemNQN
	e.Detail = action + " " + g.SubsystemNQN
	if len(superseded) > 0 {
		e.Detail += "; supersedes " + strings.Join(ids(superseded), ", ")
	}
	if len(moving) > 0 {
		e.Detail += "; moves " + strings.Join(ids(moving), ", ") + " to this root version and authentication (one host entry on the target)"
	}
	e.Keys = []audit.KeyRef{{Class: "access_root", ID: g.Scope(), Version: g.KeyVersion, Fingerprint: c.RootFingerprint}}
	for _, k := range []struct{ class, fp string }{
		{"dhchap_host", c.HostSecretFingerprint}, {"dhchap_ctrl", c.CtrlSecretFingerprint}, {"tls_psk", c.TLSPSKFingerprint},
	} {
		if k.fp != "" {
			e.Keys = append(e.Keys, audit.KeyRef{Class: k.class, ID: g.HostNQN, Version: g.KeyVersion, Fingerprint: k.fp})
		}
	}
	return e
}

// openingEntry is grantEntry before its commit decides what it
// supersedes: the store inserts "; supersedes <ids>" after the action
// and subsystem, where grantEntry names them.
func openingEntry(kind audit.EventKind, action string, sc *nvmegate.Scope, d *nvmegate.Decision, g *nvmegate.Grant,
	c keys.Credentials, moving []*nvmegate.Grant, at time.Time) *store.OpeningEntry {
	e := grantEntry(kind, action, sc, d, g, c, nil, moving, at)
	return &store.OpeningEntry{Entry: e, At: len(action + " " + g.SubsystemNQN)}
}

// denyEntry is the entry of a grant or renewal that policy allowed but
// that failed on the way, without its time and reason (failed adds them).
func denyEntry(action string, sc *nvmegate.Scope, d *nvmegate.Decision, g *nvmegate.Grant) audit.Entry {
	e := ScopeEntry(audit.EventDeny, action, sc, d)
	e.GrantID = g.ID
	return e
}

// endEntry is the entry of a grant ended (revoke, expire) at time at by
// caller ("" for the gateway itself), saying why.
func endEntry(kind audit.EventKind, g *nvmegate.Grant, caller, why string, at time.Time) audit.Entry {
	return audit.Entry{Kind: kind, Time: at, JobID: g.JobID, Tenant: g.Tenant, Caller: caller, HostNQN: g.HostNQN,
		SubsystemNQN: g.SubsystemNQN, GrantID: g.ID, ExpiresAt: g.ExpiresAt, Detail: why}
}

func ids(gs []*nvmegate.Grant) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.ID
	}
	return out
}
