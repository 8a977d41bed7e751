package etcdstore_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/etcdstore"
	"github.com/nvmegate/nvmegate/store/storetest"
)

// replicaCopy opens a gateway replica's copy of the store under prefix.
func replicaCopy(t *testing.T, cl *clientv3.Client, prefix string) *store.DB {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{Replica: etcdstore.New(cl, prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The conformance suite on three copies of one store replicated on a
// real etcd: each write goes to one copy, reads to the others.
func TestConformance(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	n := 0
	storetest.Run(t, func(t *testing.T) []*store.DB {
		n++
		prefix := fmt.Sprintf("/conformance/%d/", n)
		return []*store.DB{replicaCopy(t, cl, prefix), replicaCopy(t, cl, prefix), replicaCopy(t, cl, prefix)}
	})
}

// After the leader compacts (a snapshot, the changes it covers deleted), a
// copy that was further behind — and a new one — loads the snapshot and
// then the changes after it, and ends equal to the others.
func TestCompactThenResync(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	a := replicaCopy(t, cl, "/s/")
	behind := replicaCopy(t, cl, "/s/")
	ctx := context.Background()
	for i := range 20 {
		if err := a.CreateTarget(ctx, target(fmt.Sprintf("t%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := etcdstore.New(cl, "/s/").Compact(ctx, a)
	if err != nil || rev != a.Revision() {
		t.Fatalf("compacted at %d (%v), copy a at %d", rev, err, a.Revision())
	}
	if resp, _ := cl.Get(ctx, "/s/ch/", clientv3.WithPrefix(), clientv3.WithCountOnly()); resp.Count != 0 {
		t.Fatalf("%d changes kept after the snapshot", resp.Count)
	}
	if err := a.DeleteTarget(ctx, "t03"); err != nil {
		t.Fatal(err)
	}
	fresh := replicaCopy(t, cl, "/s/")
	if err := behind.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*store.DB{"behind": behind, "fresh": fresh} {
		if db.Revision() != a.Revision() {
			t.Fatalf("%s copy at %d, a at %d", name, db.Revision(), a.Revision())
		}
		ts, _, err := db.ListTargets(ctx, store.TargetFilter{}, store.Page{Size: 100})
		if err != nil || len(ts) != 19 {
			t.Fatalf("%s copy lists %d targets (%v), want 19", name, len(ts), err)
		}
		if _, err := db.Target(ctx, "t03"); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
			t.Fatalf("%s copy still has the deleted target", name)
		}
	}
	// Writes go on from any copy.
	if err := behind.CreateTarget(ctx, target("t99")); err != nil {
		t.Fatal(err)
	}
}

// A copy ahead of the replicated store (another cluster's, or etcd lost
// its data) is refused at Open rather than served.
func TestCopyAheadRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Replica: etcdstore.New(cl, "/one/")})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTarget(context.Background(), target("t1")); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = store.Open(filepath.Join(dir, "store.db"), store.Options{Replica: etcdstore.New(cl, "/other/")})
	if err == nil || !strings.Contains(err.Error(), "before this copy") {
		t.Fatalf("a copy ahead of its replicated store opened: %v", err)
	}
}

func target(id string) *nvmegate.Target {
	return &nvmegate.Target{ID: id, Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420"}}}
}

// countingReplica counts the catch-ups (Changes) a copy makes.
type countingReplica struct {
	store.Replica
	changes int
}

func (r *countingReplica) Changes(ctx context.Context, from uint64, fn func(store.Change) error) error {
	r.changes++
	return r.Replica.Changes(ctx, from, fn)
}

// A Sync (the read barrier of every call) on a copy already at the
// replicated revision reads only that revision: no catch-up, so the
// writers are not held up; a copy behind catches up.
func TestSyncOnCurrentCopyReadsOnlyTheRevision(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	open := func() (*store.DB, *countingReplica) {
		r := &countingReplica{Replica: etcdstore.New(cl, "/s/")}
		db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{Replica: r})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db, r
	}
	a, ra := open()
	b, rb := open()
	ctx := context.Background()
	if err := a.CreateTarget(ctx, target("t1")); err != nil {
		t.Fatal(err)
	}
	ra.changes, rb.changes = 0, 0
	if err := a.Sync(ctx); err != nil || ra.changes != 0 {
		t.Fatalf("Sync on the copy that wrote: %v, %d catch-ups", err, ra.changes)
	}
	if err := b.Sync(ctx); err != nil || rb.changes != 1 || b.Revision() != a.Revision() {
		t.Fatalf("Sync on the copy behind: %v, %d catch-ups, revision %d of %d", err, rb.changes, b.Revision(), a.Revision())
	}
}

// The Applied hook hears of another replica's change before the copy's
// revision moves to it, and reads see the change once the revision has
// (issue 29, defect 11): a relay that reads the revision first and then
// takes what the hook noted never misses a change up to that revision.
func TestAppliedHookBeforeTheRevisionMoves(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	a := replicaCopy(t, cl, "/s/")
	var b *store.DB
	type heard struct{ rev, copyRev uint64 }
	var calls []heard
	b, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{Replica: etcdstore.New(cl, "/s/"),
		Applied: func(rev uint64, targets, subsystems []string) {
			calls = append(calls, heard{rev, b.Revision()})
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	for i := range 3 {
		if err := a.CreateTarget(ctx, target(fmt.Sprintf("t%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 {
		t.Fatalf("the hook heard %d changes, want 3", len(calls))
	}
	for _, c := range calls {
		if c.copyRev != c.rev-1 {
			t.Fatalf("the hook heard of revision %d with the copy at %d: the revision moved first", c.rev, c.copyRev)
		}
	}
	if b.Revision() != a.Revision() {
		t.Fatalf("copy at %d, want %d", b.Revision(), a.Revision())
	}
	if _, err := b.Target(ctx, "t2"); err != nil {
		t.Fatalf("the last change is not readable once the revision moved: %v", err)
	}
}
