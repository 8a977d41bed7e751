package gateway

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// The typed scope handed to policy decides as the resource map built from
// the same scope: allowed, and refused for each way a scope can be wrong.
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
	base := func() *nvmegate.Scope {
		tgt := &nvmegate.Target{ID: "stor-eu-1", Region: "eu-west", Fabric: "fab-1", Driver: "nvmet"}
		sub := &nvmegate.Subsystem{NQN: "nqn.2026-01.io.nvmegate.test:acme", Tenant: "acme", TargetID: tgt.ID, DHCHAP: true}
		ns := func(nsid uint32, mode string) nvmegate.ScopeNamespace {
			n := &nvmegate.Namespace{SubsystemNQN: sub.NQN, NSID: nsid, Tenant: "acme", Region: "eu-west", DataClass: "internal",
				Dataset: nvmegate.Dataset{Name: "ds", Digest: "sha256:00"}}
			return nvmegate.ScopeNamespace{Key: n.Key(), Namespace: n, Mode: mode, Target: tgt}
		}
		j := &nvmegate.Job{ID: "job-1", Tenant: "acme", Nodes: []string{node}, State: nvmegate.JobActive,
			AllowedRegions: []string{"eu-west"}, ExpiresAt: time.Now().Add(time.Hour),
			Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: sub.NQN, NSID: 1, Mode: nvmegate.ModeReadOnly}}}
		return &nvmegate.Scope{Caller: node, Binding: nvmegate.HostBinding{SPIFFEID: node, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427", Tenant: "acme"},
			Bound: true, JobID: j.ID, Job: j, Member: true, SubsystemNQN: sub.NQN, Subsystem: sub, Target: tgt,
			Namespaces: []nvmegate.ScopeNamespace{ns(1, nvmegate.ModeReadOnly), ns(2, "")}}
	}
	cases := map[string]func(*nvmegate.Scope){
		"allowed":            func(*nvmegate.Scope) {},
		"other tenant's ns":  func(s *nvmegate.Scope) { s.Namespaces[1].Namespace.Tenant = "globex" },
		"data out of region": func(s *nvmegate.Scope) { s.Namespaces[0].Namespace.Region = "us-east" },
		"target elsewhere": func(s *nvmegate.Scope) {
			s.Namespaces[0].Target = &nvmegate.Target{ID: "x", Region: "us-east", Fabric: "f"}
		},
		"unknown namespace": func(s *nvmegate.Scope) { s.Namespaces[1].Namespace, s.Namespaces[1].Target = nil, nil },
		"no subsystem":      func(s *nvmegate.Scope) { s.Subsystem, s.Target = nil, nil },
		"no job":            func(s *nvmegate.Scope) { s.Job = nil },
		"subsystem tenant":  func(s *nvmegate.Scope) { s.Subsystem.Tenant = "globex" },
		"rw on immutable data": func(s *nvmegate.Scope) {
			s.Namespaces[0].Mode, s.Namespaces[0].Namespace.DataClass = nvmegate.ModeReadWrite, "immutable"
		},
	}
	allowed := 0
	for name, mut := range cases {
		sc := base()
		mut(sc)
		in := authz.NewInput(authz.ParseCaller(spiffeid.RequireFromString(node)), "/nvmegate.v1.Access/Connect", "", scopeResource(sc))
		byMap, err := e.Authorize(ctx, in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		typed := *in
		typed.Scope = authzScope(sc)
		byType, err := e.Authorize(ctx, &typed)
		if err != nil {
			t.Fatalf("%s typed: %v", name, err)
		}
		if byMap.Allow != byType.Allow || !slices.Equal(byMap.Reasons, byType.Reasons) || byMap.Obligations != byType.Obligations {
			t.Errorf("%s: map %v %q, typed %v %q", name, byMap.Allow, byMap.Reasons, byType.Allow, byType.Reasons)
		}
		if byMap.Allow {
			allowed++
		}
		if name == "allowed" && !byMap.Allow {
			t.Fatalf("the base scope is refused: %q", byMap.Reasons)
		}
	}
	if allowed != 1 {
		t.Errorf("%d cases allowed, want only the base one", allowed)
	}
}
