package targetagent_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

func benchHost(i int) string {
	return fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-bbbb-4000-8000-000000000000", i)
}

// BenchmarkProgramOneHost programs one host change (a grant issued, then
// released: one host entry added or removed) on a target already holding
// 10 and 10,000 hosts, through the nvmet driver on a temp dir. The store
// write is not timed. The cost should not depend on the hosts the target
// holds (before deltas: 1.4 ms and 131 ms, 464 and 230,532 allocs/op):
//
//	go test -run '^$' -bench ProgramOneHost -benchmem -benchtime 200x ./targetagent
func BenchmarkProgramOneHost(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			ctx := context.Background()
			dir := b.TempDir()
			db, err := store.Open(filepath.Join(dir, "s.db"), store.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			ks, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
			if err != nil {
				b.Fatal(err)
			}
			defer ks.Close()
			km, err := keys.NewManager(keys.Options{Backend: ks})
			if err != nil {
				b.Fatal(err)
			}
			if err := db.CreateTarget(ctx, &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverNVMet,
				Ports: []nvmegate.Port{{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"}}}); err != nil {
				b.Fatal(err)
			}
			if err := db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}); err != nil {
				b.Fatal(err)
			}
			if _, err := km.Rotate(ctx, sub, "bench"); err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			grant := func(i int) *nvmegate.Grant {
				return &nvmegate.Grant{ID: fmt.Sprintf("grant-%08d", i), JobID: "j", Tenant: "acme", Node: fmt.Sprintf("spiffe://x/node/n%d", i),
					HostNQN: benchHost(i), SubsystemNQN: sub, KeyVersion: 1, IssuedAt: now, ExpiresAt: now.Add(24 * time.Hour),
					State: nvmegate.GrantActive, DHCHAPHash: "sha256", DHGroup: "ffdhe2048"}
			}
			gs := make([]*nvmegate.Grant, n)
			for i := range gs {
				gs[i] = grant(i)
			}
			if err := db.PutGrants(ctx, gs...); err != nil {
				b.Fatal(err)
			}
			d := &nvmet.Driver{Root: filepath.Join(dir, "nvmet")}
			a := &targetagent.Agent{Store: db, Keys: km, Driver: func(*nvmegate.Target) targetagent.Driver { return d }}
			if err := a.Reconcile(ctx); err != nil {
				b.Fatal(err)
			}
			// Each iteration adds or removes one more host (the store
			// write is not timed) and programs the target.
			extra := grant(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				extra.ID, extra.State = fmt.Sprintf("grant-x%07d", i/2), nvmegate.GrantActive
				if i%2 == 1 {
					extra.State = nvmegate.GrantReleased
				}
				if err := db.PutGrant(ctx, extra); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := a.Program(ctx, "t1", targetagent.HostOf(extra)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
