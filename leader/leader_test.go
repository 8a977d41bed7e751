package leader_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/leader"
	"github.com/nvmegate/nvmegate/store"
)

func target(id string) *nvmegate.Target {
	return &nvmegate.Target{ID: id, Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420"}}}
}

// One of two replicas leads; when its lease ends (as a paused or dead
// process's does), the other leads, and a write the former leader makes
// under its term's fence — to the store or the audit log, before or after
// it notices — stores nothing.
func TestFailoverFencesTheFormerLeader(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	alog, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: "nvmegate.test/audit", Replica: etcdlog.New(cl, "/a/"),
		Signer: signer(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer alog.Close()
	// The store projects the log; its writes are proposals the replica
	// sequences while it leads, under its term's fence.
	db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{Journal: alog, Forward: nowhere{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	terms := make(chan leader.Term, 2)
	run := func(id string) *leader.Elector {
		e := &leader.Elector{Client: cl, Prefix: "/leader/", ID: id, TTL: 2}
		go e.Run(ctx, func(tm leader.Term) {
			terms <- tm
			<-tm.Ctx.Done()
		})
		return e
	}
	a := run("a")
	first := <-terms
	b := run("b")
	if err := db.Lead(audit.WithCondition(first.Ctx, first.Fence)); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTarget(ctx, target("t1")); err != nil {
		t.Fatalf("the leader's fenced write: %v", err)
	}
	select {
	case tm := <-terms:
		t.Fatalf("two leaders at once (term %d and %d)", first.Rev, tm.Rev)
	case <-time.After(500 * time.Millisecond):
	}

	// The leader's lease ends behind its back.
	if _, err := cl.Revoke(ctx, first.Lease); err != nil {
		t.Fatal(err)
	}
	second := <-terms
	if second.Rev <= first.Rev {
		t.Fatalf("the new term %d is not after %d", second.Rev, first.Rev)
	}
	// Its audit appends too: refused under the old term's fence, while an
	// append of the same batch without one (a caller's own) is recorded.
	size := alog.Size()
	if _, _, err := alog.Append(audit.WithCondition(ctx, first.Fence), entry("sweep by the former leader")); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("the former leader's append: %v", err)
	}
	if _, _, err := alog.Append(ctx, entry("a caller's")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := alog.Append(audit.WithCondition(ctx, second.Fence), entry("sweep by the new leader")); err != nil {
		t.Fatalf("the new leader's append: %v", err)
	}
	if alog.Size() != size+2 {
		t.Fatalf("log grew by %d, want 2", alog.Size()-size)
	}
	// And its checkpoints: signed, but not stored for the other replicas.
	if _, err := alog.Checkpoint(audit.WithCondition(ctx, first.Fence)); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("the former leader's checkpoint: %v", err)
	}
	if _, err := alog.Checkpoint(audit.WithCondition(ctx, second.Fence)); err != nil {
		t.Fatalf("the new leader's checkpoint: %v", err)
	}
	before := db.Revision()
	err = db.CreateTarget(ctx, target("t2")) // the former leader's store, its term not yet seen to end
	if !errors.Is(err, audit.ErrFenced) && !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("the former leader's write: %v", err)
	}
	if db.Revision() != before {
		t.Fatal("a fenced write moved the revision")
	}
	if _, err := db.Target(ctx, "t2"); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Fatalf("the fenced write is visible: %v", err)
	}
	if err := db.Lead(audit.WithCondition(second.Ctx, second.Fence)); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateTarget(ctx, target("t3")); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	select {
	case <-first.Ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the former leader's term did not end")
	}
	for deadline := time.Now().Add(10 * time.Second); a.Leading() || !b.Leading(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("leading: a %v, b %v; want b alone", a.Leading(), b.Leading())
		}
	}
}

// nowhere is a Forwarder with no leader to forward to: this test's store
// writes only while it leads.
type nowhere struct{}

func (nowhere) Forward(context.Context, []byte) ([]byte, error) { return nil, store.ErrNotLeader }

func entry(detail string) audit.Entry {
	return audit.Entry{Kind: audit.EventExpire, Caller: "spiffe://nvmegate.test/gateway/nvmegated", Detail: detail,
		Time: time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)}
}

func signer(t *testing.T) *attest.LocalSigner {
	seed := sha256.Sum256([]byte("leader-test"))
	s, err := attest.NewLocalSigner(ed25519.NewKeyFromSeed(seed[:]), 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A replica that is not the leader waits in Campaign. When its context
// ends while etcd cannot be reached, Run returns within the resignation's
// bound: Campaign's own clean-up resigns under the client's context, with
// no deadline, and would keep it until etcd came back (issue 29, defect
// 6: a follower that never stopped).
func TestFollowerStopsWhileEtcdIsDown(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	terms := make(chan leader.Term, 1)
	lead := &leader.Elector{Client: cl, Prefix: "/leader/", ID: "a", TTL: 10}
	go lead.Run(ctx, func(tm leader.Term) { terms <- tm; <-tm.Ctx.Done() })
	<-terms
	follower := &leader.Elector{Client: cl, Prefix: "/leader/", ID: "b", TTL: 10}
	fctx, fcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- follower.Run(fctx, func(leader.Term) { t.Error("the follower led while the leader's lease lasted") })
	}()
	time.Sleep(500 * time.Millisecond) // campaigning: waiting for the leader's key to go
	c.Close()                          // etcd unreachable
	stopped := time.Now()
	fcancel()
	select {
	case <-done:
		t.Logf("the follower's elector returned %s after its stop, etcd down", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("the follower's elector still running 20 s after its stop, etcd down")
	}
	if d := time.Since(stopped); d > 10*time.Second {
		t.Fatalf("the follower's elector returned %s after its stop; the bound is the resignation's 5 s", d)
	}
}
