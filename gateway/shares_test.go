package gateway_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// holder holds the unary calls of chosen identities open: its read
// barrier (which the gateway calls after the limiter has counted the call,
// before the call is decided) waits until the identity's gate opens or the
// call's context ends, and panics for one identity. It stands in for any
// slow call: a slow store, Vault, a target agent that does not answer.
type holder struct {
	mu      sync.Mutex
	gates   map[string]chan struct{} // SPIFFE ID → closed to let its calls on
	panics  string                   // a SPIFFE ID whose calls panic
	entered chan string              // each held call's caller, as it is held
}

func newHolder(paths ...string) *holder {
	h := &holder{gates: map[string]chan struct{}{}, entered: make(chan string, 1024)}
	for _, p := range paths {
		h.gates["spiffe://nvmegate.test"+p] = make(chan struct{})
	}
	return h
}

func (h *holder) option(c *gateway.Config) { c.ReadBarrier = h.barrier }

func (h *holder) barrier(ctx context.Context) error {
	id, _ := identity.PeerID(ctx)
	h.mu.Lock()
	gate, panics := h.gates[id.String()], h.panics == id.String()
	h.mu.Unlock()
	if panics {
		panic("a held call panics")
	}
	if gate == nil {
		return nil
	}
	h.entered <- id.String()
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// open lets every held call of path go on (once).
func (h *holder) open(path string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.gates["spiffe://nvmegate.test"+path])
}

// wait waits until n calls are held.
func (h *holder) wait(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-h.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("a call was not held")
		}
	}
}

// hold starts n calls of call in the background, and returns a wait for
// their errors.
func hold(n int, call func() error) (wait func() []error) {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- call() }()
	}
	return func() []error {
		var out []error
		for range n {
			out = append(out, <-errs)
		}
		return out
	}
}

// sharesZero waits until the limiter counts no call in any share: every
// call that ended gave its share back.
func sharesZero(t *testing.T, g *testGateway) {
	t.Helper()
	waitShares(t, g, "after every call ended", func(n int, roles map[string]int) bool { return n == 0 && len(roles) == 0 })
}

// waitShares waits until what the limiter counts satisfies ok.
func waitShares(t *testing.T, g *testGateway, what string, ok func(identities int, roles map[string]int) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, roles := g.srv.SharesUnderWay()
		if ok(n, roles) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d identities, roles %v", what, n, roles)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A node holding its share of calls open is refused its next call at once,
// ResourceExhausted naming the per-identity bound, while another node's
// connect and an admin's read go through; the held calls then complete,
// and no share stays counted.
func TestIdentityShare(t *testing.T) {
	h := newHolder(node)
	g, ctx := admittedGateway(t, h.option, func(c *gateway.Config) { c.MaxPerIdentity = 2 })
	flooder := pb.NewAccessClient(g.client(t, node))
	req := &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}
	done := hold(2, func() error { _, err := flooder.Connect(ctx, req); return err })
	h.wait(t, 2)

	start := time.Now()
	_, err := flooder.Connect(ctx, req)
	wantCode(t, err, codes.ResourceExhausted, "already has 2 calls under way", "per-identity bound")
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the refusal took %v: it waited", d)
	}
	// Others are served meanwhile.
	if _, err := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2")).Connect(ctx, req); err != nil {
		t.Fatalf("another node's connect while the first holds its share: %v", err)
	}
	if _, err := pb.NewInventoryClient(g.client(t, admin)).GetTarget(ctx, &pb.GetTargetRequest{Id: "stor-eu-1"}); err != nil {
		t.Fatalf("an admin's read: %v", err)
	}
	h.open(node)
	for _, err := range done() {
		if err != nil {
			t.Errorf("a held connect, let on: %v", err)
		}
	}
	sharesZero(t, g)
	// With its calls ended, the node is served again.
	if _, err := flooder.Connect(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// All auditors together are bounded by their role's share: with two
// auditors' calls held, a third auditor (with no call of its own) is
// refused ResourceExhausted naming the role; an admin is not.
func TestRoleShare(t *testing.T) {
	h := newHolder("/auditor/a", "/auditor/b")
	g := startGateway(t, h.option, func(c *gateway.Config) { c.MaxPerRole = map[string]int{"auditor": 2} })
	ctx := ctxT(t)
	checkpoint := func(path string) func() error {
		c := pb.NewAuditClient(g.client(t, path))
		return func() error { _, err := c.Checkpoint(ctx, &pb.CheckpointRequest{}); return err }
	}
	a, b := hold(1, checkpoint("/auditor/a")), hold(1, checkpoint("/auditor/b"))
	h.wait(t, 2)
	wantCode(t, checkpoint("/auditor/c")(), codes.ResourceExhausted, "callers of role auditor already have 2 calls under way", "per-role bound")
	if err := checkpoint(admin)(); err != nil {
		t.Fatalf("an admin while the auditors hold their role's share: %v", err)
	}
	h.open("/auditor/a")
	h.open("/auditor/b")
	for _, err := range append(a(), b()...) {
		if err != nil {
			t.Errorf("a held checkpoint, let on: %v", err)
		}
	}
	sharesZero(t, g)
	if err := checkpoint("/auditor/c")(); err != nil {
		t.Fatal(err)
	}
}

// A share is given back however its call ends: a panic in the call, the
// caller canceling a held call, and a call giving up while it waited for a
// slot of a full pool.
func TestSharesReturned(t *testing.T) {
	h := newHolder(node, "/node/acme-gpu-2")
	h.panics = "spiffe://nvmegate.test/admin/panicky"
	g, ctx := admittedGateway(t, h.option, func(c *gateway.Config) { c.MaxInFlight, c.MaxPerIdentity = 2, 2 })
	req := &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}

	// A panic: Internal, and nothing stays counted.
	_, err := pb.NewInventoryClient(g.client(t, "/admin/panicky")).GetTarget(ctx, &pb.GetTargetRequest{Id: "stor-eu-1"})
	wantCode(t, err, codes.Internal)
	sharesZero(t, g)

	// A held call its caller cancels.
	cctx, cancel := context.WithCancel(ctx)
	n1 := pb.NewAccessClient(g.client(t, node))
	canceled := hold(1, func() error { _, err := n1.Connect(cctx, req); return err })
	h.wait(t, 1)
	cancel()
	if err := canceled()[0]; status.Code(err) != codes.Canceled {
		t.Fatalf("the canceled call: %v", err)
	}
	sharesZero(t, g)

	// The pool full (two slots, a held call of each of two nodes): the
	// first node's second call waits for a slot, and so does an admin's
	// until its deadline; the admin's share is given back.
	n2 := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2"))
	connect := func(c pb.AccessClient) func() error {
		return func() error { _, err := c.Connect(ctx, req); return err }
	}
	held := []func() []error{hold(1, connect(n1)), hold(1, connect(n2))}
	h.wait(t, 2)
	held = append(held, hold(1, connect(n1)))
	waitShares(t, g, "the third node call waiting", func(n int, roles map[string]int) bool { return roles["node"] == 3 })
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	_, err = pb.NewInventoryClient(g.client(t, admin)).GetTarget(dctx, &pb.GetTargetRequest{Id: "stor-eu-1"})
	wantCode(t, err, codes.DeadlineExceeded)
	waitShares(t, g, "the admin's call gave up waiting", func(n int, roles map[string]int) bool {
		return n == 2 && roles["admin"] == 0 && roles["node"] == 3
	})
	h.open(node)
	h.open("/node/acme-gpu-2")
	h.wait(t, 1) // gpu-1's second call got a slot and passed the open gate
	for _, wait := range held {
		if err := wait()[0]; err != nil {
			t.Errorf("a held connect, let on: %v", err)
		}
	}
	sharesZero(t, g)
}

// A target agent's Watch stream takes nothing of its identity's share:
// with a share of one call per identity, the agent streams and still
// acknowledges every connect (Ack, unary), so the connects succeed.
func TestSharesLeaveStreams(t *testing.T) {
	g := startGateway(t, func(c *gateway.Config) { c.MaxPerIdentity = 1 })
	acmeInventory(t, g)
	waitApplied(t, startRemote(t, g, "stor-eu-1", &recordingDriver{}))
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	req := &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}
	for _, n := range []string{node, "/node/acme-gpu-2", node} {
		if _, err := pb.NewAccessClient(g.client(t, n)).Connect(ctx, req); err != nil {
			t.Fatalf("%s's connect through a streaming agent: %v", n, err)
		}
	}
	sharesZero(t, g)
}

// A connect holds its slot while it waits for the target agent's Ack; the
// Ack takes no slot, so a pool full of connects cannot starve the Acks
// they wait for. With one slot, a connect through a remote agent succeeds
// (before, the Ack queued behind it until the Hub's timeout).
func TestAcksTakeNoSlot(t *testing.T) {
	g := startGateway(t, func(c *gateway.Config) { c.MaxInFlight = 1 })
	acmeInventory(t, g)
	waitApplied(t, startRemote(t, g, "stor-eu-1", &recordingDriver{}))
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatalf("a connect with the one slot taken by itself: %v", err)
	}
	sharesZero(t, g)
}
