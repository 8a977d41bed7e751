package gateway_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Over random inventories, jobs and connect attempts by random nodes of
// every tenant: no grant ever crosses a tenant, every grant's node is in
// its job, and every refusal is PermissionDenied. The seed is fixed per
// run so that a failure can be replayed.
func TestConnectNeverCrossesTenants(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed-", seed), func(t *testing.T) { connectProperty(t, seed) })
	}
}

func connectProperty(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	g := startGateway(t)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	tenants := []string{"acme", "globex", "initech"}
	subTenant := map[string]string{}
	for i := range 5 {
		// Two targets: several subsystems (of several tenants) share one.
		tgt := validTarget()
		tgt.Id = fmt.Sprintf("stor-%d", i%2)
		if i < 2 {
			if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: tgt}); err != nil {
				t.Fatal(err)
			}
		}
		tenant := tenants[rng.IntN(len(tenants))]
		nqn := fmt.Sprintf("nqn.2026-01.io.nvmegate.test:sub-%d", i)
		subTenant[nqn] = tenant
		if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: nqn, TargetId: tgt.Id, Tenant: tenant, PortIds: []uint32{1}, Dhchap: true}}); err != nil {
			t.Fatal(err)
		}
		if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: nqn, Nsid: 1, Tenant: tenant, Region: "eu-west",
			DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: digest}}}); err != nil {
			t.Fatal(err)
		}
	}
	// Jobs: each tenant's scheduler tries to admit jobs over random
	// subsystems (of any tenant) for random nodes (of any tenant).
	type job struct {
		id, tenant string
		nodes      []string
		subs       []string
	}
	var jobs []job
	for i := range 8 {
		tenant := tenants[rng.IntN(len(tenants))]
		j := job{id: fmt.Sprintf("job-%d", i), tenant: tenant}
		req := &pb.AdmitRequest{JobId: j.id, Tenant: tenant, AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}
		// Most jobs are well-formed (the tenant's own subsystems and
		// nodes), the rest mix tenants and must be refused.
		own := rng.IntN(10) < 7
		for _, nqn := range slices.Sorted(mapKeys(subTenant)) {
			if own && subTenant[nqn] != tenant {
				continue
			}
			if rng.IntN(3) > 0 {
				req.Namespaces = append(req.Namespaces, &pb.JobNamespace{SubsystemNqn: nqn, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY})
				j.subs = append(j.subs, nqn)
			}
		}
		for n := range 2 {
			nt := tenants[rng.IntN(len(tenants))]
			if own {
				nt = tenant
			}
			id := fmt.Sprintf("spiffe://nvmegate.test/node/%s-gpu-%d", nt, n)
			if !slices.Contains(req.Nodes, id) {
				req.Nodes = append(req.Nodes, id)
			}
		}
		j.nodes = req.Nodes
		if len(req.Namespaces) == 0 {
			continue
		}
		_, err := pb.NewJobsClient(g.client(t, "/tenant/"+tenant+"/scheduler/s")).Admit(ctx, req)
		if err == nil {
			jobs = append(jobs, j)
		} else if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("admit %s: %v", j.id, err)
		}
	}
	granted := 0
	for range 60 {
		if len(jobs) == 0 {
			break
		}
		j := jobs[rng.IntN(len(jobs))]
		nodeTenant := tenants[rng.IntN(len(tenants))]
		nodePath := fmt.Sprintf("/node/%s-gpu-%d", nodeTenant, rng.IntN(2))
		subs := slices.Sorted(mapKeys(subTenant))
		sub := subs[rng.IntN(len(subs))]
		resp, err := pb.NewAccessClient(g.client(t, nodePath)).Connect(ctx, &pb.ConnectRequest{JobId: j.id, SubsystemNqn: sub})
		if err != nil {
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("connect %s %s %s: %v", nodePath, j.id, sub, err)
			}
			continue
		}
		granted++
		gr := resp.Grant
		if gr.Tenant != j.tenant || subTenant[sub] != j.tenant || !slices.Contains(j.nodes, "spiffe://nvmegate.test"+nodePath) || !slices.Contains(j.subs, sub) {
			t.Fatalf("grant crosses scope: node %s (tenant %s), job %s of %s, subsystem %s of %s", nodePath, nodeTenant, j.id, j.tenant, sub, subTenant[sub])
		}
	}
	t.Logf("seed %d: %d jobs admitted, %d of 60 connects granted", seed, len(jobs), granted)
	if granted == 0 {
		t.Fatal("no connect was granted: the property was not exercised")
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
