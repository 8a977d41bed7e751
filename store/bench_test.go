package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/nvmegate/nvmegate"
)

const (
	benchSubsystems = 100
	benchPerSub     = 100 // 10,000 namespaces
)

// benchDB returns a store with 10,000 namespaces in 100 subsystems of four
// tenants, loaded without fsync; the benchmarks then run with it.
func benchDB(b *testing.B) *DB {
	b.Helper()
	ctx := context.Background()
	db := openTestDB(b)
	noSync(db)
	tenants := []string{"acme", "globex", "initech", "umbrella"}
	must(b, db.CreateTarget(ctx, newTarget("t1")))
	for i := range benchSubsystems {
		tenant := tenants[i%len(tenants)]
		must(b, db.CreateSubsystem(ctx, newSubsystem(subNQN(i), "t1", tenant)))
		for nsid := range uint32(benchPerSub) {
			must(b, db.CreateNamespace(ctx, newNamespace(subNQN(i), nsid+1, tenant)))
		}
	}
	db.bolt.NoSync = false
	return db
}

func BenchmarkNamespace(b *testing.B) {
	db := benchDB(b)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		nqn, nsid := subNQN(rng.IntN(benchSubsystems)), uint32(1+rng.IntN(benchPerSub))
		if _, err := db.Namespace(ctx, nqn, nsid); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListNamespaces(b *testing.B) {
	db := benchDB(b)
	ctx := context.Background()
	list := func(b *testing.B, f NamespaceFilter, size int, want int) {
		b.ReportAllocs()
		for b.Loop() {
			got := collect(b, func(p Page) ([]*nvmegate.Namespace, string, error) { return db.ListNamespaces(ctx, f, p) }, size)
			if len(got) != want {
				b.Fatalf("%d namespaces, want %d", len(got), want)
			}
		}
	}
	b.Run("first-page-100", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			items, next, err := db.ListNamespaces(ctx, NamespaceFilter{}, Page{})
			if err != nil || len(items) != 100 || next == "" {
				b.Fatal(len(items), next, err)
			}
		}
	})
	b.Run("all-10000-pages-of-1000", func(b *testing.B) { list(b, NamespaceFilter{}, 1000, 10000) })
	b.Run("subsystem-100", func(b *testing.B) { list(b, NamespaceFilter{SubsystemNQN: subNQN(57)}, 100, 100) })
	b.Run("tenant-2500-pages-of-100", func(b *testing.B) { list(b, NamespaceFilter{Tenant: "globex"}, 100, 2500) })
}

// BenchmarkCreateNamespace measures one durable create (fsync on commit).
func BenchmarkCreateNamespace(b *testing.B) {
	db := openTestDB(b)
	ctx := context.Background()
	must(b, db.CreateTarget(ctx, newTarget("t1")))
	must(b, db.CreateSubsystem(ctx, newSubsystem(subNQN(0), "t1", "acme")))
	nsid := uint32(0)
	for b.Loop() {
		nsid++
		if err := db.CreateNamespace(ctx, newNamespace(subNQN(0), nsid, "acme")); err != nil {
			b.Fatal(err)
		}
	}
}

// grantBenchDB returns a store with two subsystems of t1: subNQN(0) with
// 1,000 active grants and subNQN(1) with 10,000, spread over 2,500 nodes
// (four or five grants each), plus 1,000 released grants; and a job of
// 10,000 nodes (job-big) and one of 10 (job-small). Loaded without fsync.
func grantBenchDB(b *testing.B) *DB {
	b.Helper()
	ctx := context.Background()
	db := openTestDB(b)
	noSync(db)
	inventory(b, db, "acme", "acme")
	must(b, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(b, db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "acme")))
	for s, n := range []int{1000, 10000} {
		var gs []*nvmegate.Grant
		for i := range n {
			g := newGrant(i, subNQN(s))
			g.ID, g.Node = fmt.Sprintf("grant-%d-%05d", s, i), nodeID(i%benchNodes)
			gs = append(gs, g)
			if len(gs) == 500 {
				must(b, db.PutGrants(ctx, gs...))
				gs = nil
			}
		}
	}
	var ended []*nvmegate.Grant
	for i := range 1000 {
		g := newGrant(i, subNQN(0))
		g.ID, g.State = fmt.Sprintf("grant-x-%05d", i), nvmegate.GrantReleased
		ended = append(ended, g)
	}
	must(b, db.PutGrants(ctx, ended...))
	for id, nodes := range map[string]int{"job-big": 10000, "job-small": 10} {
		j := newJob(id, "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly},
			nvmegate.JobNamespace{SubsystemNQN: subNQN(1), NSID: 1, Mode: nvmegate.ModeReadWrite})
		j.Nodes = make([]string, nodes)
		for i := range j.Nodes {
			j.Nodes[i] = nodeID(i)
		}
		must(b, db.CreateJob(ctx, j))
	}
	db.bolt.NoSync = false
	return db
}

const benchNodes = 2500

// BenchmarkHotReads measures the reads of every Connect and of the target
// programmer, on a store holding 11,000 active grants.
func BenchmarkHotReads(b *testing.B) {
	db := grantBenchDB(b)
	ctx := context.Background()
	b.Run("Job/nodes-10", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if j, err := db.Job(ctx, "job-small"); err != nil || len(j.Nodes) != 10 {
				b.Fatal(err)
			}
		}
	})
	b.Run("Job/nodes-10000", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if j, err := db.Job(ctx, "job-big"); err != nil || len(j.Nodes) != 10000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("Subsystem", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := db.Subsystem(ctx, subNQN(1)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Target", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := db.Target(ctx, "t1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("HostBindingByNQN/absent", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := db.HostBindingByNQN(ctx, hostNQN(1)); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
				b.Fatal(err)
			}
		}
	})
	b.Run("Grant", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := db.Grant(ctx, "grant-1-04242"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for s, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("SubsystemGrants/grants-%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if gs, err := db.SubsystemGrants(ctx, subNQN(s)); err != nil || len(gs) != n {
					b.Fatal(len(gs), err)
				}
			}
		})
	}
	b.Run("NodeActiveGrants", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for b.Loop() {
			if gs, err := db.NodeActiveGrants(ctx, nodeID(rng.IntN(benchNodes))); err != nil || len(gs) < 4 {
				b.Fatal(len(gs), err)
			}
		}
	})
	b.Run("NodeGrants", func(b *testing.B) {
		rng := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for b.Loop() {
			if gs, err := db.NodeGrants(ctx, nodeID(rng.IntN(benchNodes)), "job-1", subNQN(1)); err != nil || len(gs) != 4 {
				b.Fatal(len(gs), err)
			}
		}
	})
	// What the target programmer reads of a target's subsystems and their
	// namespaces (targetagent.Agent.State), grants aside.
	b.Run("TargetInventory", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			subs, err := All(func(p Page) ([]*nvmegate.Subsystem, string, error) {
				return db.ListSubsystems(ctx, SubsystemFilter{TargetID: "t1"}, p)
			})
			if err != nil || len(subs) != 2 {
				b.Fatal(len(subs), err)
			}
			for _, s := range subs {
				ns, err := All(func(p Page) ([]*nvmegate.Namespace, string, error) {
					return db.ListNamespaces(ctx, NamespaceFilter{SubsystemNQN: s.NQN}, p)
				})
				if err != nil || len(ns) != 1 {
					b.Fatal(len(ns), err)
				}
			}
		}
	})
}
