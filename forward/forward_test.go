package forward_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/forward"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
)

var (
	td        = spiffeid.RequireTrustDomainFromString("nvmegate.test")
	gatewayID = spiffeid.RequireFromPath(td, "/nvmegated")
	bg        = context.Background()
)

// replica is one gateway replica's log, store and peer service, on a
// real gRPC server with mutual TLS.
type replica struct {
	log    *audit.Log
	db     *store.DB
	addr   string
	client *forward.Client
}

// world is replicas of one log on a real etcd, forwarding to whichever
// leads (the test says who).
type world struct {
	t      *testing.T
	ca     *devca.CA
	cl     *clientv3.Client
	mu     sync.Mutex
	leader int
	reps   []*replica
	// lose, if set, is asked after each forwarded call replica i served:
	// true drops its answer, as a leader that dies after committing.
	lose func(i int) bool
	// deaf are the replicas that do not watch the log (a paused or cut-off
	// replica's watch lags): only their read barrier brings commits.
	deaf map[int]bool
}

func source(t *testing.T, ca *devca.CA, id spiffeid.ID) identity.Source {
	svid, err := ca.Issue(id, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return identity.StaticSource(svid, ca.Bundle())
}

func newWorld(t *testing.T, n int) *world {
	ca, err := devca.New(td, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ca: ca, cl: etcdtest.Start(t, 1).Client(t), leader: -1}
	for i := range n {
		w.add(i)
	}
	return w
}

func (w *world) add(i int) {
	t := w.t
	src := source(t, w.ca, gatewayID)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{addr: lis.Addr().String()}
	r.client = &forward.Client{Creds: identity.ClientCredentials(src, tlsconfig.AuthorizeID(gatewayID)), Patience: 2 * time.Second,
		Leading: func() bool { return r.db != nil && r.db.Leading() },
		Resolve: func(context.Context) (string, bool, bool, error) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.leader < 0 {
				return "", false, false, nil
			}
			return w.reps[w.leader].addr, w.leader == i, true, nil
		}}
	seed := sha256.Sum256([]byte("forward-test"))
	signer, err := attest.NewLocalSigner(ed25519.NewKeyFromSeed(seed[:]), 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if r.log, err = audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/forward", Signer: signer,
		Replica: etcdlog.New(w.cl, "/fwd/audit/"), Forward: r.client, History: r.client}); err != nil {
		t.Fatal(err)
	}
	if r.db, err = store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: r.log, Forward: r.client}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		if w.deaf[i] {
			return
		}
		_ = etcdlog.New(w.cl, "/fwd/audit/").FollowCommits(ctx, w.cl, r.log.Offer, func(ctx context.Context, _ uint64) error { return r.log.Sync(ctx) })
	}()
	t.Cleanup(func() { cancel(); <-followed })
	s := grpc.NewServer(grpc.Creds(identity.ServerCredentials(src, td)), grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			if w.lose != nil && w.lose(i) {
				return nil, status.Error(codes.Unavailable, "the answer was lost") // made, then the leader "died"
			}
			return resp, err
		}))
	(&forward.Server{Store: r.db, Log: r.log, Peers: func(id spiffeid.ID) bool { return id == gatewayID }}).Register(s)
	go s.Serve(lis)
	t.Cleanup(func() { s.Stop(); r.client.Close(); r.db.Close(); r.log.Close() })
	w.reps = append(w.reps, r)
}

// elect makes replica i lead a new term.
func (w *world) elect(i int) {
	key := fmt.Sprintf("/fwd/term/%d", i)
	resp, err := w.cl.Put(bg, key, "x")
	if err != nil {
		w.t.Fatal(err)
	}
	ctx := audit.WithCondition(bg, clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision))
	if err := w.reps[i].db.Lead(ctx); err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	w.leader = i
	w.mu.Unlock()
}

func target(id string) *nvmegate.Target {
	return &nvmegate.Target{ID: id, Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420"}}}
}

// A follower's writes and appends reach the leader over gRPC with mutual
// TLS; the follower reads them at once (read your writes), a refusal
// comes back with the store's code, and no commit loses a compare.
func TestFollowerWritesThroughLeader(t *testing.T) {
	w := newWorld(t, 2)
	w.elect(0)
	f := w.reps[1]
	if err := f.db.CreateTarget(bg, target("t1")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.db.Target(bg, "t1"); err != nil {
		t.Fatalf("the follower does not read its own write: %v", err)
	}
	if _, err := w.reps[0].db.Target(bg, "t1"); err != nil {
		t.Fatalf("the leader does not hold the follower's write: %v", err)
	}
	if err := f.db.CreateTarget(bg, target("t1")); nvmegate.ErrorCode(err) != nvmegate.EEXISTS {
		t.Fatalf("a duplicate through the leader: %v, want %s", err, nvmegate.EEXISTS)
	}
	e := audit.Entry{Kind: audit.EventDeny, Tenant: "acme", Caller: "spiffe://nvmegate.test/node/n1", Detail: "refused"}
	idx, leaf, err := f.log.Append(bg, e)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range w.reps {
		if err := r.log.Sync(bg); err != nil {
			t.Fatal(err)
		}
		if h, err := r.log.LeafHashAt(idx); err != nil || h != leaf {
			t.Fatalf("replica %d: leaf %d is %x (%v), the follower was told %x", i, idx, h, err, leaf)
		}
		if n := r.log.LostCompares(); n != 0 {
			t.Fatalf("replica %d lost %d compares", i, n)
		}
	}
}

// A retry of a forwarded write (its answer lost) is answered as the first
// call was and applied once.
func TestRetryAppliedOnce(t *testing.T) {
	w := newWorld(t, 2)
	w.elect(0)
	conn, err := grpc.NewClient(w.reps[0].addr, grpc.WithTransportCredentials(
		identity.ClientCredentials(source(t, w.ca, gatewayID), tlsconfig.AuthorizeID(gatewayID))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := []byte(fmt.Sprintf("%032x", 7) + `{"op":"create_target","args":{"record":{"ID":"t-retry","Fabric":"fab-a","Region":"eu-west","Driver":"nvmet","Ports":[{"ID":1,"Transport":"tcp","AddressFamily":"ipv4","Address":"192.0.2.10","ServiceID":"4420"}]}}}`)
	var answers []string
	for range 3 {
		out := new(wrapperspb.BytesValue)
		if err := conn.Invoke(bg, "/nvmegate.internal.v1.Sequencer/Store", wrapperspb.Bytes(req), out); err != nil {
			t.Fatal(err)
		}
		answers = append(answers, string(out.Value))
	}
	if answers[0] != answers[1] || answers[1] != answers[2] {
		t.Fatalf("a retried write answered %q", answers)
	}
	if got := w.reps[0].db.Revision(); got != 1 {
		t.Fatalf("revision %d after one write sent three times (answer %s)", got, answers[0])
	}
}

// Only the gateway's replicas may forward: another workload of the trust
// domain is refused, and nothing it sent is applied.
func TestOnlyReplicasForward(t *testing.T) {
	w := newWorld(t, 1)
	w.elect(0)
	intruder := source(t, w.ca, spiffeid.RequireFromPath(td, "/node/gpu-1"))
	conn, err := grpc.NewClient(w.reps[0].addr, grpc.WithTransportCredentials(identity.ClientCredentials(intruder, tlsconfig.AuthorizeID(gatewayID))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := []byte(fmt.Sprintf("%032x", 1) + `{"op":"delete_target","args":{"kind":"target","id":"t1"}}`)
	err = conn.Invoke(bg, "/nvmegate.internal.v1.Sequencer/Store", wrapperspb.Bytes(req), new(wrapperspb.BytesValue))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node forwarding a write: %v", err)
	}
	if w.reps[0].db.Revision() != 0 {
		t.Fatal("the refused write was applied")
	}
}

// With no leader, a write waits out the client's patience and fails as
// not sequenced; once one leads, writes go on.
func TestNoLeaderThenLeader(t *testing.T) {
	w := newWorld(t, 2)
	err := w.reps[1].db.CreateTarget(bg, target("t-none"))
	if !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a write with no leader: %v", err)
	}
	w.elect(1)
	if err := w.reps[0].db.CreateTarget(bg, target("t-after")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reps[1].db.Target(bg, "t-none"); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Fatalf("the write made with no leader: %v", err)
	}
}

// A write that began while no replica led, on the replica then elected,
// is made there once it leads: it does not wait for a leader that is
// itself until the client gives up.
func TestElectedWhileWaiting(t *testing.T) {
	w := newWorld(t, 2)
	done := make(chan error, 1)
	go func() { done <- w.reps[1].db.CreateTarget(bg, target("t-early")) }()
	time.Sleep(200 * time.Millisecond) // the write is waiting for a leader
	start := time.Now()
	w.elect(1)
	if err := <-done; err != nil {
		t.Fatalf("a write begun before its replica was elected: %v", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("the write waited %s after its replica led", waited)
	}
	if err := w.reps[0].db.Sync(bg); err != nil { // every call's read barrier
		t.Fatal(err)
	}
	if _, err := w.reps[0].db.Target(bg, "t-early"); err != nil {
		t.Fatalf("the other replica lacks the write: %v", err)
	}
}

// A write whose answer was lost with the leader that made it, retried
// after the caller's own replica was elected, is recognised by its ID and
// answered "outcome unknown" — not made a second time, and not reported as
// "not made".
func TestAnswerLostThenCallerLeads(t *testing.T) {
	w := newWorld(t, 2)
	w.elect(0)
	var once sync.Once
	w.lose = func(i int) bool {
		lost := false
		if i == 0 {
			once.Do(func() {
				lost = true
				w.elect(1) // the caller's replica leads before it retries
			})
		}
		return lost
	}
	before := w.reps[0].db.Revision()
	err := w.reps[1].db.CreateTarget(bg, target("t-lost"))
	if nvmegate.ErrorCode(err) != nvmegate.EUNAVAILABLE || errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a write whose answer was lost: %v; want EUNAVAILABLE, outcome unknown", err)
	}
	if err := w.reps[1].db.Sync(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reps[1].db.Target(bg, "t-lost"); err != nil {
		t.Fatalf("the write the first leader made is gone: %v", err)
	}
	if got := w.reps[1].db.Revision(); got != before+1 {
		t.Fatalf("revision %d after one write, want %d (made twice?)", got, before+1)
	}
}

// A replica that joins after the leader trimmed etcd's log fills the
// history from the leader's copy over the peer service, and its store
// holds what was written before the trim; another workload may not read
// the history.
func TestJoinAfterTrim(t *testing.T) {
	w := newWorld(t, 2)
	w.elect(0)
	for i := range 12 {
		if err := w.reps[1].db.CreateTarget(bg, target(fmt.Sprintf("t%02d", i))); err != nil {
			t.Fatal(err)
		}
	}
	lead := w.reps[0].log
	key := "/fwd/term/0"
	resp, err := w.cl.Get(bg, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the term's key: %v", err)
	}
	fence := audit.WithCondition(bg, clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Kvs[0].CreateRevision))
	start, _, err := etcdlog.New(w.cl, "/fwd/audit/").Trim(fence, lead.Size()-1)
	if err != nil || start < 10 {
		t.Fatalf("trim: start %d, %v", start, err)
	}
	w.add(2)
	joined := w.reps[2]
	if joined.log.Size() < lead.Size() {
		t.Fatalf("the new replica's copy holds %d entries, the leader's %d", joined.log.Size(), lead.Size())
	}
	if _, err := joined.db.Target(bg, "t00"); err != nil {
		t.Fatalf("the new replica lacks a write made before the trim: %v", err)
	}
	if a, b := joined.db.Revision(), w.reps[0].db.Revision(); a != b {
		t.Fatalf("the new replica's store is at revision %d, the leader's %d", a, b)
	}

	intruder := source(t, w.ca, spiffeid.RequireFromPath(td, "/node/gpu-1"))
	conn, err := grpc.NewClient(w.reps[0].addr, grpc.WithTransportCredentials(identity.ClientCredentials(intruder, tlsconfig.AuthorizeID(gatewayID))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Invoke(bg, "/nvmegate.internal.v1.Sequencer/History", wrapperspb.Bytes([]byte(`{"from":0,"to":5}`)), new(wrapperspb.BytesValue))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node reading the log's history: %v", err)
	}
}

// A leader deposed without knowing it (its term's context has not ended:
// paused, or cut off from etcd, while its lease runs out) passes the read
// barrier like any replica: a call on it after the new leader's write
// sees that write.
func TestDeposedLeaderReadsThroughBarrier(t *testing.T) {
	w := &world{t: t, leader: -1, deaf: map[int]bool{0: true}}
	ca, err := devca.New(td, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w.ca, w.cl = ca, etcdtest.Start(t, 1).Client(t)
	w.add(0)
	w.add(1)
	w.elect(0)
	w.elect(1) // replica 0 still believes it leads
	if err := w.reps[1].db.CreateTarget(bg, target("t-new-term")); err != nil {
		t.Fatal(err)
	}
	old := w.reps[0].db
	if !old.Leading() {
		t.Fatal("the deposed leader should still believe it leads")
	}
	if err := old.Sync(bg); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Target(bg, "t-new-term"); err != nil {
		t.Fatalf("a call on the deposed leader does not see the new leader's write: %v", err)
	}
}
