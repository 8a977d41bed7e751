package gateway_test

import (
	"encoding/json"
	"fmt"
	"runtime/debug"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/policy"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// BenchmarkRedecideAfterPolicyLoad measures what a policy load costs the
// active grants (issue 15: 10,000 re-decided within 2 s of a load): each
// op loads a new policy revision (untimed) and re-decides every active
// grant under it, cold — no decision of the new revision is memoized yet.
// The grants are real: 10,000 nodes of one job connected through the
// gateway. A dry run, as every grant stays allowed: what is timed is the
// re-decision, not the revocations (each of which is a revoke, timed by
// the lease's own tests).
//
//	go test -run '^$' -bench RedecideAfterPolicyLoad -benchtime 5x ./gateway
func BenchmarkRedecideAfterPolicyLoad(b *testing.B) {
	// The daemon's runtime settings (nvmegated's runtime.gc_percent and
	// runtime.memory_limit defaults: GOGC 400, a 768 MiB soft limit), not
	// the test binary's GOGC 100: a re-decision's OPA garbage is a third
	// of its time under the latter.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(768 << 20))
	const grants = 10000
	g := startGateway(b)
	acmeInventory(b, g)
	ctx := b.Context()
	ids := make([]string, grants)
	for i := range ids {
		ids[i] = fmt.Sprintf("spiffe://nvmegate.test/node/re-%d", i)
	}
	req := admitRequest("job-re")
	req.Nodes, req.ExpiresAt = ids, timestamppb.New(time.Now().Add(2*time.Hour))
	if _, err := pb.NewJobsClient(g.client(b, sched)).Admit(ctx, req); err != nil {
		b.Fatal(err)
	}
	var eg errgroup.Group
	eg.SetLimit(32)
	for _, id := range ids {
		eg.Go(func() error {
			now := time.Now()
			svid, err := g.ca.Issue(spiffeid.RequireFromString(id), now.Add(-time.Minute), now.Add(time.Hour))
			if err != nil {
				return err
			}
			c := nodeConn(b, g, svid)
			defer c.Close()
			_, err = pb.NewAccessClient(c).Connect(ctx, &pb.ConnectRequest{JobId: "job-re", SubsystemNqn: subNQN})
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		b.Fatal(err)
	}
	files := shippedPolicy(b)
	rego := files["authz.rego"].Data
	b.ReportAllocs()
	rev := 0
	for b.Loop() {
		b.StopTimer()
		rev++
		files["authz.rego"].Data = fmt.Appendf(append([]byte{}, rego...), "\n# revision %d\n", rev)
		bundle, err := policy.Load(files)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.engine.Reload(ctx, bundle, "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "bench"}, nil, true)
		if err != nil {
			b.Fatal(err)
		}
		if d.Checked != grants || len(d.Ending)+len(d.Tightening) != 0 {
			b.Fatalf("re-decided %d, %d ending, %d tightening", d.Checked, len(d.Ending), len(d.Tightening))
		}
	}
	b.ReportMetric(float64(grants)*float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}

// BenchmarkAttestCompliance measures a compliance attestation of an
// inventory of 10,000 namespaces (100 subsystems of 100 namespaces on one
// target, each namespace with its data key): each op builds the
// predicate, signs it and records it in the log. It reports the bundle's
// size.
//
//	go test -run '^$' -bench AttestCompliance -benchtime 3x ./gateway
func BenchmarkAttestCompliance(b *testing.B) {
	g := startGateway(b)
	ctx := b.Context()
	if _, err := pb.NewInventoryClient(g.client(b, admin)).AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		b.Fatal(err)
	}
	for s := range 100 {
		nqn := fmt.Sprintf("nqn.2026-01.io.nvmegate.test:bench-%d", s)
		sub := &nvmegate.Subsystem{NQN: nqn, TargetID: "stor-eu-1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}
		if err := g.db.CreateSubsystem(ctx, sub); err != nil {
			b.Fatal(err)
		}
		for n := 1; n <= 100; n++ {
			ns := &nvmegate.Namespace{SubsystemNQN: nqn, NSID: uint32(n), Tenant: "acme", Region: "eu-west", DataClass: "internal",
				Dataset: nvmegate.Dataset{Name: "ds", Digest: digest}}
			if err := g.db.CreateNamespace(ctx, ns); err != nil {
				b.Fatal(err)
			}
			if _, err := g.keyStore.CreateDataKey(ctx, gateway.NamespaceKeyName(nqn, uint32(n)), ns.Incarnation); err != nil {
				b.Fatal(err)
			}
		}
	}
	var size int
	for b.Loop() {
		a, err := g.srv.AttestCompliance(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(a.Predicate.Tenants[0].Namespaces); n != 10000 || len(a.Predicate.OutOfCompliance) != 0 {
			b.Fatalf("%d namespaces, findings %v", n, a.Predicate.OutOfCompliance[:min(3, len(a.Predicate.OutOfCompliance))])
		}
		raw, _ := json.Marshal(a.Bundle)
		size = len(raw)
	}
	b.ReportMetric(float64(size), "bundle-bytes")
}
