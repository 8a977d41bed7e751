package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// failing is a driver that refuses every state.
type failing struct{}

func (failing) Apply(context.Context, fabric.State) error      { return errors.New("disk on fire") }
func (failing) ApplyDelta(context.Context, fabric.Delta) error { return errors.New("disk on fire") }

// startRemote runs a remote agent as target id with driver d until the test
// ends, and reports each generation it applied.
func startRemote(t *testing.T, g *testGateway, id string, d targetagent.Driver) <-chan uint64 {
	t.Helper()
	g.remote.Store(id, true) // configured remote: the gateway's own driver leaves it alone
	applied := make(chan uint64, 100)
	r := &targetagent.Remote{Conn: g.client(t, "/target/"+id), Driver: d, Applied: func(gen uint64, err error) {
		if err == nil {
			applied <- gen
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return applied
}

func waitApplied(t *testing.T, ch <-chan uint64) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the remote agent applied nothing")
	}
}

// A remote agent with its target's SVID receives that target's state and
// nothing else; Connect answers only after it acknowledged the host; an
// agent that cannot apply makes Connect fail with no grant; other callers
// cannot watch.
func TestRemoteTargetAgent(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	other := validTarget()
	other.Id = "stor-eu-2"
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddTarget(ctx, &pb.AddTargetRequest{Target: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	remoteRoot, otherRoot := t.TempDir(), t.TempDir()
	applied := startRemote(t, g, "stor-eu-1", &nvmet.Driver{Root: remoteRoot})
	otherApplied := startRemote(t, g, "stor-eu-2", &nvmet.Driver{Root: otherRoot})
	waitApplied(t, applied)
	waitApplied(t, otherApplied)

	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(filepath.Join(remoteRoot, "hosts", c.Grant.HostNqn, "dhchap_key"))
	if err != nil || strings.TrimSpace(string(key)) != c.Credentials.DhchapHostSecret {
		t.Fatalf("the remote agent's target does not have the host before the answer: %v", err)
	}
	// The embedded driver was not used for a target whose agent is remote.
	if _, err := os.Stat(filepath.Join(g.configfs, "stor-eu-1", "hosts", c.Grant.HostNqn)); !os.IsNotExist(err) {
		t.Fatalf("embedded tree written too: %v", err)
	}
	// The other target's agent saw none of it.
	ents, _ := os.ReadDir(filepath.Join(otherRoot, "hosts"))
	subs, _ := os.ReadDir(filepath.Join(otherRoot, "subsystems"))
	if len(ents) != 0 || len(subs) != 0 {
		t.Fatalf("another target's agent received hosts %v subsystems %v", ents, subs)
	}

	// Not a target agent: refused by policy. An agent of a target the
	// inventory does not have: NotFound (about its own name only).
	for who, code := range map[string]codes.Code{node: codes.PermissionDenied, admin: codes.PermissionDenied, "/target/no-such-target": codes.NotFound} {
		s, err := pb.NewTargetAgentClient(g.client(t, who)).Watch(ctx, &pb.WatchRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, err, code)
	}
}

func TestRemoteAgentFailureMeansNoGrant(t *testing.T) {
	g, ctx := admittedGateway(t)
	startRemote(t, g, "stor-eu-1", failing{})
	// Wait until the agent's stream is up (its first, refused, generation).
	deadline := time.Now().Add(10 * time.Second)
	var err error
	for time.Now().Before(deadline) {
		_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
		if err != nil && strings.Contains(err.Error(), "disk on fire") || err != nil && strings.Contains(err.Error(), "did not accept") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantCode(t, err, codes.Unavailable, "did not accept the host")
	list, lerr := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1", State: pb.GrantState_GRANT_STATE_ACTIVE})
	if lerr != nil || len(list.Grants) != 0 {
		t.Fatalf("active grants after a refused target: %v %v", list, lerr)
	}
}

// An agent restarted (its storage server rebooted, the tree lost) gets the
// whole current state on its first Watch and restores exactly the granted
// hosts.
func TestRemoteAgentRestart(t *testing.T) {
	g, ctx := admittedGateway(t)
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	// The agent comes up, applies the current state, and goes down with
	// its storage server, whose tree is lost.
	root := t.TempDir()
	g.remote.Store("stor-eu-1", true) // from now on programmed by its own agent
	r := &targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"), Driver: &nvmet.Driver{Root: root}}
	first := make(chan uint64, 10)
	r.Applied = func(gen uint64, err error) {
		if err == nil {
			first <- gen
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(rctx); close(done) }()
	waitApplied(t, first)
	if _, err := os.Stat(filepath.Join(root, "hosts", c.Grant.HostNqn)); err != nil {
		t.Fatalf("first agent run: %v", err)
	}
	cancel()
	<-done
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	applied := startRemote(t, g, "stor-eu-1", &nvmet.Driver{Root: root})
	waitApplied(t, applied)
	key, err := os.ReadFile(filepath.Join(root, "hosts", c.Grant.HostNqn, "dhchap_key"))
	if err != nil || strings.TrimSpace(string(key)) != c.Credentials.DhchapHostSecret {
		t.Fatalf("after the agent restarted: %v", err)
	}
}

// countingDriver counts a driver's whole and delta applications.
type countingDriver struct {
	targetagent.Driver
	whole, deltas atomic.Int32
}

func (c *countingDriver) Apply(ctx context.Context, s fabric.State) error {
	c.whole.Add(1)
	return c.Driver.Apply(ctx, s)
}

func (c *countingDriver) ApplyDelta(ctx context.Context, d fabric.Delta) error {
	c.deltas.Add(1)
	return c.Driver.ApplyDelta(ctx, d)
}

// A remote agent gets its target's whole state once, then every grant
// change as a delta; after each (connects, renewals after a rotation,
// releases, a job's grants revoked), its tree is exactly what a whole
// Apply of the store's state makes on an empty one.
func TestRemoteAgentDeltas(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	for _, job := range []string{"job-1", "job-2"} {
		if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest(job)); err != nil {
			t.Fatal(err)
		}
	}
	base := t.TempDir() // as treeOf reads it: <base>/stor-eu-1
	d := &countingDriver{Driver: &nvmet.Driver{Root: filepath.Join(base, "stor-eu-1")}}
	waitApplied(t, startRemote(t, g, "stor-eu-1", d))
	nodes := []pb.AccessClient{pb.NewAccessClient(g.client(t, node)), pb.NewAccessClient(g.client(t, "/node/acme-gpu-2"))}
	keysc, admins := pb.NewKeysClient(g.client(t, admin)), pb.NewAccessClient(g.client(t, admin))
	tgt, err := g.db.Target(ctx, "stor-eu-1")
	if err != nil {
		t.Fatal(err)
	}
	grants := map[int][]string{} // node → its grant IDs
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 16 {
		n := rng.IntN(2)
		var what string
		switch op := rng.IntN(5); {
		case op < 2 || len(grants[n]) == 0:
			job := fmt.Sprint("job-", 1+rng.IntN(2))
			c, err := nodes[n].Connect(ctx, &pb.ConnectRequest{JobId: job, SubsystemNqn: subNQN})
			if err != nil {
				t.Fatal(err)
			}
			grants[n], what = append(grants[n], c.Grant.GrantId), "connect "+job
		case op == 2:
			if _, err := keysc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN}); err != nil {
				t.Fatal(err)
			}
			fallthrough
		case op == 3:
			id := grants[n][rng.IntN(len(grants[n]))]
			_, err := nodes[n].Renew(ctx, &pb.RenewRequest{GrantId: id})
			if code := status.Code(err); err != nil && code != codes.FailedPrecondition {
				t.Fatal(err) // a superseded grant is no longer active: FailedPrecondition
			}
			what = "renew"
		default:
			id := grants[n][rng.IntN(len(grants[n]))]
			if _, err := nodes[n].Release(ctx, &pb.ReleaseRequest{GrantId: id}); err != nil && status.Code(err) != codes.FailedPrecondition {
				t.Fatal(err)
			}
			what = "release"
		}
		if i == 12 {
			if _, err := admins.Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_JobId{JobId: "job-1"}, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			what += ", revoke job-1"
		}
		st, err := g.agent.State(ctx, tgt)
		if err != nil {
			t.Fatal(err)
		}
		whole := t.TempDir()
		if err := (&nvmet.Driver{Root: filepath.Join(whole, "stor-eu-1")}).Apply(ctx, st); err != nil {
			t.Fatal(err)
		}
		names := map[string]string{} // one naming for both: equal names, equal secrets
		if got, want := treeOf(t, &testGateway{configfs: base}, names), treeOf(t, &testGateway{configfs: whole}, names); got != want {
			t.Fatalf("step %d (%s): the remote tree\n%s\nthe store's state\n%s", i, what, got, want)
		}
	}
	// (A change that leaves the hosts' entries as they were — a node
	// connecting again at the same keys — sends nothing.)
	if d.whole.Load() != 1 || d.deltas.Load() < 3 {
		t.Fatalf("%d whole states and %d deltas; want 1 whole state, then deltas", d.whole.Load(), d.deltas.Load())
	}
	// An inventory change: the next programming run sends the whole state,
	// with the new subsystem.
	sub2 := validSubsystem()
	sub2.Nqn = subNQN + "-2"
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub2}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[0].Connect(ctx, &pb.ConnectRequest{JobId: "job-2", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "stor-eu-1", "subsystems", sub2.Nqn)); err != nil || d.whole.Load() != 2 {
		t.Fatalf("after an inventory change: %d whole states, the new subsystem: %v", d.whole.Load(), err)
	}
}

// The attack of issue 14: with a target's agent connected, a second agent
// with the same target SVID (a second instance, a debugging run) connects
// and goes away. The second is refused while the first is live, its
// acknowledgements count for nothing, and the real agent keeps receiving:
// a release takes the host off its tree before it is answered.
func TestSecondTargetAgentCannotCutOffTheFirst(t *testing.T) {
	g, ctx := admittedGateway(t)
	root := t.TempDir()
	waitApplied(t, startRemote(t, g, "stor-eu-1", &nvmet.Driver{Root: root}))

	// The second instance: its Watch is refused, however often it tries.
	second := pb.NewTargetAgentClient(g.client(t, "/target/stor-eu-1"))
	for range 3 {
		s, err := second.Watch(ctx, &pb.WatchRequest{AcceptDeltas: true})
		if err == nil {
			_, err = s.Recv()
		}
		wantCode(t, err, codes.FailedPrecondition, "already has a connected agent")
	}
	// Operators see it, by target.
	if n := counterSum(t, g, "nvmegate_target_agent_streams_refused_total", "target", "stor-eu-1"); n != 3 {
		t.Fatalf("nvmegate_target_agent_streams_refused_total{target=stor-eu-1} = %v, want 3", n)
	}
	// A second Remote runs beside the first for a while and goes away.
	otherRoot := t.TempDir()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		(&targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"), Driver: &nvmet.Driver{Root: otherRoot}}).Run(rctx)
		close(done)
	}()
	time.Sleep(time.Second)
	cancel()
	<-done
	// An acknowledgement that did not come on the live stream is refused.
	for _, stream := range []string{"", "0123456789abcdef01234567"} {
		_, err := second.Ack(ctx, &pb.AckRequest{Generation: 1 << 40, StreamId: stream})
		wantCode(t, err, codes.FailedPrecondition, "not the target's live stream")
	}

	// The first agent still programs the target: connect, then release.
	ac := pb.NewAccessClient(g.client(t, node))
	c, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(root, "hosts", c.Grant.HostNqn)
	if _, err := os.Stat(host); err != nil {
		t.Fatalf("the first agent's tree lacks the granted host: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(otherRoot, "hosts")); len(ents) != 0 {
		t.Fatalf("the refused agent received hosts: %v", ents)
	}
	if _, err := ac.Release(ctx, &pb.ReleaseRequest{GrantId: c.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(host); !os.IsNotExist(err) {
		t.Fatalf("released, but the host is still on the target: %v", err)
	}
}

// A target the gateway programs with its own driver takes no remote agent:
// a stolen or misconfigured target SVID cannot become its programmer.
func TestLocalTargetRefusesRemoteAgent(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	s, err := pb.NewTargetAgentClient(g.client(t, "/target/stor-eu-1")).Watch(ctxT(t), &pb.WatchRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, err, codes.FailedPrecondition, "programs this target with its own driver")
}

// switchable applies with d until fail is set, then refuses every state.
type switchable struct {
	d    targetagent.Driver
	fail atomic.Bool
}

func (s *switchable) Apply(ctx context.Context, st fabric.State) error {
	if s.fail.Load() {
		return errors.New("disk on fire")
	}
	return s.d.Apply(ctx, st)
}

func (s *switchable) ApplyDelta(ctx context.Context, d fabric.Delta) error {
	if s.fail.Load() {
		return errors.New("disk on fire")
	}
	return s.d.ApplyDelta(ctx, d)
}

// A finish whose grants the target did not drop is not a success: it
// answers Unavailable, and the same finish again, once the target
// follows, ends them and answers OK with the host gone. (A scheduler's
// hook or the CSI driver retries on Unavailable; an OK would have left
// the host on the target with no one retrying.)
func TestFinishIsNotOKWhileTheTargetKeepsTheHost(t *testing.T) {
	g, ctx := admittedGateway(t)
	root := t.TempDir()
	d := &switchable{d: &nvmet.Driver{Root: root}}
	waitApplied(t, startRemote(t, g, "stor-eu-1", d))
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(root, "hosts", c.Grant.HostNqn)
	if _, err := os.Stat(host); err != nil {
		t.Fatalf("the host is not on the target after its connect: %v", err)
	}
	d.fail.Store(true)
	jobs := pb.NewJobsClient(g.client(t, sched))
	_, err = jobs.Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	wantCode(t, err, codes.Unavailable, "is finished, but", "retry the call")
	if _, err := os.Stat(host); err != nil {
		t.Fatalf("the failing target dropped the host anyway: %v", err)
	}
	d.fail.Store(false)
	var fin *pb.FinishResponse
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		fin, err = jobs.Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || fin.Job.State != pb.JobState_JOB_STATE_FINISHED {
		t.Fatalf("the finish again, the target following: %v", err)
	}
	if _, err := os.Stat(host); !os.IsNotExist(err) {
		t.Fatalf("finish answered OK with the host still on the target: %v", err)
	}
}
