// Package storetest is the conformance suite of the inventory store's
// deployments: one gateway's store, and replicas each projecting one log
// replicated on etcd, the leader sequencing every write the others forward
// (store/forward.go). The same tests run against both, through the
// store's public methods; with several copies, each write goes to one
// copy and each read to another, so that what a replica wrote and what
// the rules saw are checked across replicas.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/store"
)

// Open returns the copies of one fresh store the suite writes and reads
// (one for bbolt, two or more for a replicated store), closed by the
// caller's cleanup.
type Open func(t *testing.T) []*store.DB

// Run runs the suite.
func Run(t *testing.T, open Open) {
	t.Run("InventoryAcrossCopies", func(t *testing.T) { inventoryAcrossCopies(t, open(t)) })
	t.Run("NoLostUpdate", func(t *testing.T) { noLostUpdate(t, open(t)) })
	t.Run("OneIdentityPerHostNQN", func(t *testing.T) { oneIdentityPerHostNQN(t, open(t)) })
	t.Run("ConcurrentGrants", func(t *testing.T) { concurrentGrants(t, open(t)) })
	t.Run("NoGrantAfterJobEnds", func(t *testing.T) { noGrantAfterJobEnds(t, open(t)) })
	t.Run("JobRunsAndNodesAcrossCopies", func(t *testing.T) { jobRunsAndNodes(t, open(t)) })
	t.Run("ScopeFeedHearsOtherCopies", func(t *testing.T) { scopeFeed(t, open(t)) })
}

var ctx = context.Background()

// pick returns copy i, round robin.
func pick(dbs []*store.DB, i int) *store.DB { return dbs[i%len(dbs)] }

func syncAll(t *testing.T, dbs []*store.DB) {
	t.Helper()
	for _, db := range dbs {
		if err := db.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// same checks that every copy is at one revision with the same keys.
func same(t *testing.T, dbs []*store.DB) {
	t.Helper()
	syncAll(t, dbs)
	var want []byte
	var wantRev uint64
	for i, db := range dbs {
		var b bytes.Buffer
		rev, err := db.Dump(ctx, func(w store.Write) error {
			fmt.Fprintf(&b, "%s %x %x\n", w.Bucket, w.Key, w.Value)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			want, wantRev = b.Bytes(), rev
			continue
		}
		if rev != wantRev || !bytes.Equal(b.Bytes(), want) || db.Revision() != dbs[0].Revision() {
			t.Fatalf("copy %d at revision %d (model %d) differs from copy 0 at %d (model %d)", i, rev, db.Revision(), wantRev, dbs[0].Revision())
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if nvmegate.ErrorCode(err) != code {
		t.Fatalf("got %v, want %s", err, code)
	}
}

func target(id string) *nvmegate.Target {
	return &nvmegate.Target{ID: id, Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420"}}}
}

func subNQN(i int) string { return fmt.Sprintf("nqn.2026-01.io.nvmegate:sub-%04d", i) }

func subsystem(i int, target string) *nvmegate.Subsystem {
	return &nvmegate.Subsystem{NQN: subNQN(i), TargetID: target, Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}
}

func namespace(sub string, nsid uint32) *nvmegate.Namespace {
	return &nvmegate.Namespace{SubsystemNQN: sub, NSID: nsid, Tenant: "acme", Region: "eu-west",
		DataClass: nvmegate.ClassRestricted,
		Dataset:   nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: "sha256:" + strings.Repeat("ab", 32)}}
}

func nodeID(i int) string { return fmt.Sprintf("spiffe://example.org/node/n%04d", i) }

func hostNQN(i int) string {
	return fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-4000-8000-%012x", i, i)
}

func grant(i int, job, sub string) *nvmegate.Grant {
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	return &nvmegate.Grant{ID: fmt.Sprintf("grant-%04d", i), JobID: job, Tenant: "acme", Node: nodeID(i), HostNQN: hostNQN(i),
		SubsystemNQN: sub, KeyVersion: 1, IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: nvmegate.GrantActive,
		DecisionID: "d", AuditIndex: uint64(i), DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
}

// A record written on one copy is read on every other, and the rules
// between records hold across copies: a namespace added on one copy keeps
// its subsystem from being deleted on another.
func inventoryAcrossCopies(t *testing.T, dbs []*store.DB) {
	must(t, pick(dbs, 0).CreateTarget(ctx, target("t1")))
	must(t, pick(dbs, 1).CreateSubsystem(ctx, subsystem(0, "t1")))
	must(t, pick(dbs, 2).CreateNamespace(ctx, namespace(subNQN(0), 1)))
	syncAll(t, dbs)
	for i, db := range dbs {
		if _, err := db.Target(ctx, "t1"); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		subs, _, err := db.ListSubsystems(ctx, store.SubsystemFilter{TargetID: "t1"}, store.Page{})
		if err != nil || len(subs) != 1 {
			t.Fatalf("copy %d: subsystems of t1: %v %v", i, subs, err)
		}
		nss, _, err := db.ListNamespaces(ctx, store.NamespaceFilter{SubsystemNQN: subNQN(0)}, store.Page{})
		if err != nil || len(nss) != 1 {
			t.Fatalf("copy %d: namespaces: %v %v", i, nss, err)
		}
	}
	wantCode(t, pick(dbs, 1).DeleteSubsystem(ctx, subNQN(0)), nvmegate.ECONFLICT)
	wantCode(t, pick(dbs, 0).DeleteTarget(ctx, "t1"), nvmegate.ECONFLICT)
	must(t, pick(dbs, 1).DeleteNamespace(ctx, subNQN(0), 1))
	must(t, pick(dbs, 0).DeleteSubsystem(ctx, subNQN(0)))
	syncAll(t, dbs)
	for i, db := range dbs {
		if _, err := db.Subsystem(ctx, subNQN(0)); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
			t.Fatalf("copy %d: a deleted subsystem: %v", i, err)
		}
	}
	same(t, dbs)
}

// Two copies that have not seen each other's writes create the same
// record: one creates it, the other is told it exists — it ran its rules
// again on top of the first's write rather than overwrite it.
func noLostUpdate(t *testing.T, dbs []*store.DB) {
	must(t, pick(dbs, 0).CreateTarget(ctx, target("t1")))
	// No Sync: copy 1 (if there is one) has not seen t1.
	wantCode(t, pick(dbs, 1).CreateTarget(ctx, target("t1")), nvmegate.EEXISTS)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		won  int
		errs []error
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pick(dbs, i).CreateSubsystem(ctx, subsystem(7, "t1"))
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				won++
			} else {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Fatalf("%d copies created one subsystem", won)
	}
	for _, err := range errs {
		wantCode(t, err, nvmegate.EEXISTS)
	}
	same(t, dbs)
}

// Two identities bound to one host NQN on two copies at once: one
// binding is made, the other refused.
func oneIdentityPerHostNQN(t *testing.T, dbs []*store.DB) {
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		won []string
	)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &nvmegate.HostBinding{SPIFFEID: nodeID(100 + i), HostNQN: hostNQN(1), Tenant: "acme"}
			if err := pick(dbs, i).CreateHostBinding(ctx, h); err == nil {
				mu.Lock()
				won = append(won, h.SPIFFEID)
				mu.Unlock()
			} else if c := nvmegate.ErrorCode(err); c != nvmegate.ECONFLICT && c != nvmegate.EEXISTS {
				t.Errorf("binding %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("host NQN bound to %v", won)
	}
	syncAll(t, dbs)
	for i, db := range dbs {
		h, err := db.HostBindingByNQN(ctx, hostNQN(1))
		if err != nil || h.SPIFFEID != won[0] {
			t.Fatalf("copy %d: the NQN's binding %v %v, want %s", i, h, err, won[0])
		}
	}
	same(t, dbs)
}

// Grants written concurrently on every copy are all kept, with their
// indexes, and every copy serves them.
func concurrentGrants(t *testing.T, dbs []*store.DB) {
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pick(dbs, i).PutGrants(ctx, grant(i, "job-1", subNQN(i%3))); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	syncAll(t, dbs)
	for c, db := range dbs {
		total := 0
		for s := range 3 {
			gs, err := db.SubsystemGrants(ctx, subNQN(s))
			must(t, err)
			total += len(gs)
		}
		if total != n {
			t.Fatalf("copy %d serves %d active grants, want %d", c, total, n)
		}
		gs, err := db.NodeActiveGrants(ctx, nodeID(17))
		if err != nil || len(gs) != 1 || gs[0].ID != "grant-0017" {
			t.Fatalf("copy %d: grants of node 17: %v %v", c, gs, err)
		}
	}
	// A grant ended on one copy is no longer active on any.
	g, err := pick(dbs, 1).Grant(ctx, "grant-0005")
	must(t, err)
	g.State = nvmegate.GrantRevoked
	must(t, pick(dbs, 1).PutGrants(ctx, g))
	syncAll(t, dbs)
	for c, db := range dbs {
		if gs, _ := db.NodeActiveGrants(ctx, nodeID(5)); len(gs) != 0 {
			t.Fatalf("copy %d: a revoked grant is active", c)
		}
	}
	same(t, dbs)
}

// A job finished on one copy takes no grant on another.
func noGrantAfterJobEnds(t *testing.T, dbs []*store.DB) {
	db0 := pick(dbs, 0)
	must(t, db0.CreateTarget(ctx, target("t1")))
	must(t, db0.CreateSubsystem(ctx, subsystem(0, "t1")))
	must(t, db0.CreateNamespace(ctx, namespace(subNQN(0), 1)))
	j := &nvmegate.Job{ID: "job-9", Tenant: "acme", Scheduler: "spiffe://example.org/tenant/acme/scheduler/s",
		Nodes: []string{nodeID(1)}, Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: time.Now().Add(24 * time.Hour), DecisionID: "d-1"}
	must(t, db0.CreateJob(ctx, j))
	must(t, pick(dbs, 1).PutGrants(ctx, grant(1, "job-9", subNQN(0))))
	if _, _, err := pick(dbs, 2).FinishJob(ctx, "job-9", nil); err != nil {
		t.Fatal(err)
	}
	g := grant(2, "job-9", subNQN(0))
	wantCode(t, pick(dbs, 3).PutGrants(ctx, g), nvmegate.ECONFLICT)
	same(t, dbs)
}

// A scheduler's calls through different copies: an admission retried
// through another copy is the same job, a node removed through one takes
// no grant through another, a finish retried changes nothing, and the
// next generation is admitted through a third.
func jobRunsAndNodes(t *testing.T, dbs []*store.DB) {
	db0 := pick(dbs, 0)
	must(t, db0.CreateTarget(ctx, target("t1")))
	must(t, db0.CreateSubsystem(ctx, subsystem(0, "t1")))
	must(t, db0.CreateNamespace(ctx, namespace(subNQN(0), 1)))
	expires := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	job := func(gen uint32) *nvmegate.Job {
		return &nvmegate.Job{ID: "4242", Tenant: "acme", Scheduler: "spiffe://example.org/tenant/acme/scheduler/s",
			Nodes: []string{nodeID(1), nodeID(2)}, Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly}},
			AllowedRegions: []string{"eu-west"}, ExpiresAt: expires, DecisionID: "d-1", Generation: gen, User: "alice"}
	}
	first := job(0)
	must(t, db0.CreateJob(ctx, first))
	again := job(0)
	must(t, pick(dbs, 1).CreateJob(ctx, again))
	if !again.AdmittedAt.Equal(first.AdmittedAt) {
		t.Fatalf("the retried admission through another copy: admitted at %v, the first at %v", again.AdmittedAt, first.AdmittedAt)
	}
	j, err := pick(dbs, 2).UpdateJobNodes(ctx, "4242", nil, nil, []string{nodeID(1)})
	if err != nil || len(j.Nodes) != 1 || j.Nodes[0] != nodeID(2) {
		t.Fatalf("node 1 removed: %+v, %v", j, err)
	}
	wantCode(t, pick(dbs, 3).PutGrants(ctx, grant(1, "4242", subNQN(0))), nvmegate.ECONFLICT)
	zero := uint32(0)
	if _, unchanged, err := pick(dbs, 1).FinishJob(ctx, "4242", &zero); err != nil || unchanged {
		t.Fatalf("finish of generation 0: unchanged %v, %v", unchanged, err)
	}
	if j, unchanged, err := pick(dbs, 2).FinishJob(ctx, "4242", &zero); err != nil || !unchanged || j.State != nvmegate.JobFinished {
		t.Fatalf("the finish retried through another copy: %+v, unchanged %v, %v", j, unchanged, err)
	}
	must(t, pick(dbs, 3).CreateJob(ctx, job(1)))
	if err := db0.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := db0.Job(ctx, "4242"); err != nil || got.Generation != 1 || got.State != nvmegate.JobActive || got.User != "alice" {
		t.Fatalf("generation 1 as another copy reads it: %+v, %v", got, err)
	}
	same(t, dbs)
}

// A scope change made on one copy reaches the scope feed of another once
// that copy has applied it (its re-decisions follow every replica's
// changes).
func scopeFeed(t *testing.T, dbs []*store.DB) {
	f := pick(dbs, 1).WatchScope()
	must(t, pick(dbs, 0).CreateTarget(ctx, target("t-feed")))
	syncAll(t, dbs)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ch, err := f.Next(cctx)
	if err != nil || len(ch.Targets) != 1 || ch.Targets[0] != "t-feed" {
		t.Fatalf("feed: %+v %v", ch, err)
	}
}
