package store

import (
	"context"
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
