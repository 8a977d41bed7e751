package etcdstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/internal/benchload"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/etcdstore"
)

// BenchmarkPutGrants: grant writes per second and their p99, 64 writers,
// on the single-file store and on one and three copies of a store
// replicated on a 3-member etcd (in this process, WALs fsync'd), in one
// run. With three copies the writers are spread over them, as connects
// over three gateway replicas.
//
//	go test -run '^$' -bench PutGrants -benchtime 4000x ./store/etcdstore/
func BenchmarkPutGrants(b *testing.B) {
	c := etcdtest.Start(b, 3)
	cl := c.Client(b)
	run := 0
	for _, tc := range []struct {
		name   string
		copies int
	}{{"bbolt", 0}, {"etcd3/replicas=1", 1}, {"etcd3/replicas=3", 3}} {
		b.Run(tc.name, func(b *testing.B) {
			run++
			var dbs []*store.DB
			open := func(opts store.Options) {
				db, err := store.Open(filepath.Join(b.TempDir(), "store.db"), opts)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { db.Close() })
				dbs = append(dbs, db)
			}
			if tc.copies == 0 {
				open(store.Options{})
			}
			for range tc.copies {
				open(store.Options{Replica: etcdstore.New(cl, fmt.Sprintf("/bench/%d/", run))})
			}
			benchGrants(b, dbs, 64)
		})
	}
}

func benchGrants(b *testing.B, dbs []*store.DB, writers int) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	benchload.Run(b, writers, "grants", func(i, w int) error {
		g := &nvmegate.Grant{ID: fmt.Sprintf("grant-%07d", i), JobID: "job-1", Tenant: "acme",
			Node:         fmt.Sprintf("spiffe://example.org/node/n%07d", i),
			HostNQN:      fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-4000-8000-%012x", i, i),
			SubsystemNQN: fmt.Sprintf("nqn.2026-01.io.nvmegate:sub-%02d", i%16), KeyVersion: 1,
			IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: nvmegate.GrantActive, DecisionID: "d",
			DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
		return dbs[w%len(dbs)].PutGrants(ctx, g)
	})
}
