package gateway

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// The typed resource handed to policy (no map) decides as the resource map
// built from the same scope, allow, reasons and obligations, for connect
// and renew, cold and memoized, for each way a scope can be: allowed, and
// refused or allowed otherwise for a caller not a member, unbound, bound to
// another tenant, records missing or of another tenant, ro and rw, a job
// expired or finished. And the map the typed resource describes
// (authz.Input.ResourceMap, what a refusal's audit entry reads) is
// scopeResource's, key for key and type for type. All of it holds for the
// scope sealed once per revision and shared by the job's callers
// (sealedScopes).
func TestPolicyScopeDecidesAsTheMap(t *testing.T) {
	ctx := context.Background()
	td := spiffeid.RequireTrustDomainFromString("nvmegate.test")
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	e, err := authz.NewEngine(ctx, authz.Options{TrustDomain: td, Bundle: b, Source: "embedded"})
	if err != nil {
		t.Fatal(err)
	}
	node := "spiffe://nvmegate.test/node/acme-gpu-1"
	// One expiry for every scope: the records of one store revision.
	expires := time.Now().Add(time.Hour).In(time.FixedZone("CET", 3600))
	base := func() *nvmegate.Scope {
		tgt := &nvmegate.Target{ID: "stor-eu-1", Region: "eu-west", Fabric: "fab-1", Driver: "nvmet"}
		sub := &nvmegate.Subsystem{NQN: "nqn.2026-01.io.nvmegate.test:acme", Tenant: "acme", TargetID: tgt.ID, DHCHAP: true}
		ns := func(nsid uint32, mode string) nvmegate.ScopeNamespace {
			n := &nvmegate.Namespace{SubsystemNQN: sub.NQN, NSID: nsid, Tenant: "acme", Region: "eu-west", DataClass: "internal",
				Dataset: nvmegate.Dataset{Name: "ds", Digest: "sha256:00"}, QoS: nvmegate.QoS{MaxIOPS: 1000 * uint64(nsid)}}
			return nvmegate.ScopeNamespace{Key: n.Key(), Namespace: n, Mode: mode, Target: tgt}
		}
		j := &nvmegate.Job{ID: "job-1", Tenant: "acme", Scheduler: "spiffe://nvmegate.test/tenant/acme/scheduler/s",
			Nodes: []string{node, "spiffe://nvmegate.test/node/acme-gpu-2"}, State: nvmegate.JobActive,
			AllowedRegions: []string{"eu-west"}, ExpiresAt: expires,
			Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: sub.NQN, NSID: 1, Mode: nvmegate.ModeReadOnly}}}
		return &nvmegate.Scope{Caller: node, Binding: nvmegate.HostBinding{SPIFFEID: node, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427", Tenant: "acme"},
			Bound: true, JobID: j.ID, Job: j, Member: true, SubsystemNQN: sub.NQN, Subsystem: sub, Target: tgt,
			Namespaces: []nvmegate.ScopeNamespace{ns(1, nvmegate.ModeReadOnly), ns(2, "")}, TTL: "1h0m0s"}
	}
	cases := []struct {
		name  string
		mut   func(*nvmegate.Scope)
		allow bool
	}{
		{"allowed", func(*nvmegate.Scope) {}, true},
		{"rw", func(s *nvmegate.Scope) { s.Namespaces[0].Mode = nvmegate.ModeReadWrite }, true},
		{"asked for a host NQN and no TTL", func(s *nvmegate.Scope) { s.HostNQN, s.TTL = s.Binding.HostNQN, "" }, true},
		{"not a member", func(s *nvmegate.Scope) { s.Member = false }, false},
		{"unbound", func(s *nvmegate.Scope) { s.Bound, s.Binding.Tenant = false, "" }, true},
		{"bound to globex", func(s *nvmegate.Scope) { s.Binding.Tenant = "globex" }, false},
		{"job expired", func(s *nvmegate.Scope) { s.Job.ExpiresAt = expires.Add(-61 * time.Minute) }, false},
		{"job finished", func(s *nvmegate.Scope) { s.Job.State = nvmegate.JobFinished }, false},
		{"globex's job", func(s *nvmegate.Scope) { s.Job.Tenant = "globex" }, false},
		{"other tenant's ns", func(s *nvmegate.Scope) { s.Namespaces[1].Namespace.Tenant = "globex" }, false},
		{"data out of region", func(s *nvmegate.Scope) { s.Namespaces[0].Namespace.Region = "us-east" }, false},
		{"target elsewhere", func(s *nvmegate.Scope) {
			s.Namespaces[0].Target = &nvmegate.Target{ID: "x", Region: "us-east", Fabric: "f"}
		}, false},
		{"unplaced namespace", func(s *nvmegate.Scope) { s.Namespaces[0].Target = nil }, false},
		{"unknown namespace", func(s *nvmegate.Scope) { s.Namespaces[1].Namespace, s.Namespaces[1].Target = nil, nil }, false},
		{"no subsystem", func(s *nvmegate.Scope) { s.Subsystem, s.Target = nil, nil }, false},
		{"no target", func(s *nvmegate.Scope) { // the subsystem's, which its namespaces are on
			s.Target = nil
			for i := range s.Namespaces {
				s.Namespaces[i].Target = nil
			}
		}, false},
		{"no job", func(s *nvmegate.Scope) { s.Job, s.Member = nil, false }, false},
		{"subsystem tenant", func(s *nvmegate.Scope) { s.Subsystem.Tenant = "globex" }, false},
		{"rw on immutable data", func(s *nvmegate.Scope) {
			s.Namespaces[0].Mode, s.Namespaces[0].Namespace.DataClass = nvmegate.ModeReadWrite, "immutable"
		}, false},
	}
	// Sealed scopes (sealedScopes): each case is a store revision of its
	// own; a case that changes only the caller's fields is also decided
	// on the first case's template, as another node of the job at the
	// same revision would be.
	sealed := &sealedScopes{m: map[sealedKey]*authz.Scope{}}
	callerOnly := map[string]bool{"asked for a host NQN and no TTL": true, "not a member": true, "unbound": true, "bound to globex": true}
	for i, tc := range cases {
		for _, method := range []string{"/nvmegate.v1.Access/Connect", "/nvmegate.v1.Access/Renew"} {
			sc := base()
			tc.mut(sc)
			byMap := authz.NewInput(authz.ParseCaller(spiffeid.RequireFromString(node)), method, "", scopeResource(sc))
			typed := *byMap
			typed.Resource, typed.Scope = nil, authzScope(sc)
			if got, want := typed.ResourceMap(), byMap.Resource; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the typed resource's map\n%#v\nscopeResource's\n%#v", tc.name, got, want)
			}
			revs := []uint64{uint64(i + 1)}
			if callerOnly[tc.name] {
				revs = append(revs, 1)
			}
			for _, rev := range revs {
				in := typed
				in.Scope = sealed.scope(sc, rev)
				if got, want := in.ResourceMap(), byMap.Resource; !reflect.DeepEqual(got, want) {
					t.Errorf("%s (sealed at %d): the resource's map\n%#v\nscopeResource's\n%#v", tc.name, rev, got, want)
				}
				dm, err := e.Authorize(ctx, byMap)
				if err != nil {
					t.Fatal(err)
				}
				ds, err := e.Authorize(ctx, &in)
				if err != nil {
					t.Fatal(err)
				}
				if dm.Allow != ds.Allow || !slices.Equal(dm.Reasons, ds.Reasons) || dm.Obligations != ds.Obligations {
					t.Errorf("%s %s (sealed at %d): map %v %q, sealed %v %q", tc.name, method, rev, dm.Allow, dm.Reasons, ds.Allow, ds.Reasons)
				}
			}
			for _, pass := range []string{"cold", "memoized"} {
				dm, err := e.Authorize(ctx, byMap)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				dt, err := e.Authorize(ctx, &typed)
				if err != nil {
					t.Fatalf("%s typed: %v", tc.name, err)
				}
				if dm.Allow != dt.Allow || !slices.Equal(dm.Reasons, dt.Reasons) || dm.Obligations != dt.Obligations {
					t.Errorf("%s %s (%s): map %v %q %+v, typed %v %q %+v", tc.name, method, pass, dm.Allow, dm.Reasons, dm.Obligations, dt.Allow, dt.Reasons, dt.Obligations)
				}
				if dm.Allow != tc.allow {
					t.Errorf("%s %s: allow %t, want %t (%q)", tc.name, method, dm.Allow, tc.allow, dm.Reasons)
				}
			}
		}
	}
}
