package gateway

import (
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/lease"
)

// The lease records a node's call from its typed scope; the gateway
// records other calls from their policy input. For a node's call the two
// must be the same entry, byte for byte: entryFor over the input
// scopeResource makes of a scope, or over the typed input of a connect or
// renew (authzScope, no map), equals lease.ScopeEntry of the scope.
func TestScopeEntryIsEntryFor(t *testing.T) {
	const sub = "nqn.2026-01.io.nvmegate.test:acme-train"
	tgt := &nvmegate.Target{ID: "stor-eu-1", Region: "eu-west", Fabric: "fab-eu", Driver: nvmegate.DriverNVMet}
	subsystem := &nvmegate.Subsystem{NQN: sub, Tenant: "acme", TargetID: tgt.ID, DHCHAP: true}
	ns1 := &nvmegate.Namespace{SubsystemNQN: sub, NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: "immutable",
		Dataset: nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: "sha256:" + string(make64('a'))}}
	job := &nvmegate.Job{ID: "job-1", Tenant: "acme", Scheduler: "spiffe://nvmegate.test/tenant/acme/scheduler/s",
		Nodes: []string{"spiffe://nvmegate.test/node/n1"}, State: nvmegate.JobActive,
		ExpiresAt: time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.FixedZone("CET", 3600))}
	binding := nvmegate.HostBinding{SPIFFEID: "spiffe://nvmegate.test/node/n1", HostNQN: "nqn.2026-01.io.nvmegate.test:host-1", Tenant: "acme"}
	nss := []nvmegate.ScopeNamespace{
		{Key: ns1.Key(), Namespace: ns1, Mode: nvmegate.ModeReadOnly, Target: tgt},
		{Key: nvmegate.NamespaceKey{SubsystemNQN: sub, NSID: 2}, Mode: nvmegate.ModeReadWrite}, // not in the inventory
		{Key: nvmegate.NamespaceKey{SubsystemNQN: sub, NSID: 0}},                               // no NSID: not recorded
	}
	decision := &nvmegate.Decision{Allow: true, ID: "d-1", PolicyRevision: "sha256:abc", Reasons: []string{"ok"}}
	scopes := map[string]*nvmegate.Scope{
		"connect": {Caller: binding.SPIFFEID, Binding: binding, Bound: true, JobID: job.ID, Job: job, Member: true,
			SubsystemNQN: sub, Subsystem: subsystem, Target: tgt, Namespaces: nss, TTL: "1h0m0s"},
		"discover": {Caller: binding.SPIFFEID, Binding: binding, Bound: true, JobID: job.ID, Job: job, Member: true, Namespaces: nss[:1]},
		"no job, subsystem": {Caller: binding.SPIFFEID, Binding: nvmegate.HostBinding{SPIFFEID: binding.SPIFFEID, HostNQN: binding.HostNQN},
			JobID: "job-x", SubsystemNQN: sub, Subsystem: subsystem},
		"no job, no subsystem record": {Caller: binding.SPIFFEID, Binding: binding, Bound: true, JobID: "job-x", SubsystemNQN: sub + "-x"},
		"no job":                      {Caller: binding.SPIFFEID, Binding: binding, Bound: true, JobID: "job-x"},
		"tenantless job": {Caller: binding.SPIFFEID, Binding: binding, Bound: true, JobID: job.ID,
			Job: &nvmegate.Job{ID: job.ID, State: nvmegate.JobActive}, SubsystemNQN: sub, Subsystem: subsystem, Target: tgt},
	}
	for name, sc := range scopes {
		for _, d := range []*nvmegate.Decision{decision, nil} {
			for _, action := range []string{"access.connect", "access.renew"} {
				ins := []*authz.Input{{Caller: authz.Caller{ID: sc.Caller}, Action: action, Resource: scopeResource(sc)}}
				if typedCall(sc) { // the input policy saw: typed, no map
					ins = append(ins, &authz.Input{Caller: authz.Caller{ID: sc.Caller}, Action: action, Scope: authzScope(sc)})
				}
				for _, in := range ins {
					want, got := entryFor(in, d, audit.EventDeny), lease.ScopeEntry(audit.EventDeny, action, sc, d)
					want.Time, got.Time = time.Unix(1, 0), time.Unix(1, 0)
					wb, err := want.Encode()
					if err != nil {
						t.Fatal(err)
					}
					gb, err := got.Encode()
					if err != nil {
						t.Fatal(err)
					}
					if string(gb) != string(wb) {
						t.Errorf("%s (%s, decision %v, typed %v):\nlease   %s\ngateway %s", name, action, d != nil, in.Scope != nil, gb, wb)
					}
				}
			}
		}
	}
}
