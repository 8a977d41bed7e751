package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/internal/logbuf"
	"github.com/nvmegate/nvmegate/internal/netfreeze"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// runAgent runs a remote agent for stor-eu-1 over replicas (one
// connection each) with driver d until the test ends; every generation it
// applied or refused goes to events.
func runAgent(t *testing.T, replicas []grpc.ClientConnInterface, d targetagent.Driver, log *slog.Logger, silence time.Duration) (*targetagent.Remote, <-chan error) {
	t.Helper()
	events := make(chan error, 100)
	r := &targetagent.Remote{Replicas: replicas, Driver: d, Log: log, Silence: silence, Applied: func(_ uint64, err error) {
		select {
		case events <- err:
		default:
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r, events
}

func nextEvent(t *testing.T, events <-chan error) error {
	t.Helper()
	select {
	case err := <-events:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the agent applied or refused nothing")
		return nil
	}
}

// Issue 29, defect 2: an agent never applies a state older than one it
// has applied. Two gateways stand for a current replica and one that
// lags (its store at an earlier revision): the agent applies the current
// one's state, and when that one goes, it refuses the lagging one's — the
// released host would be back on the target — and keeps what it had.
func TestAgentRefusesAStateOlderThanOneApplied(t *testing.T) {
	current, lagging := startGateway(t), startGateway(t)
	acmeInventory(t, current)
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(current.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewInventoryClient(lagging.client(t, admin)).AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	if lagging.db.Revision() >= current.db.Revision() {
		t.Fatalf("the lagging store is at %d, the current one at %d", lagging.db.Revision(), current.db.Revision())
	}
	current.remote.Store("stor-eu-1", true)
	lagging.remote.Store("stor-eu-1", true)
	d := &recordingDriver{}
	logs := &logbuf.Buffer{}
	r, events := runAgent(t, []grpc.ClientConnInterface{current.client(t, "/target/stor-eu-1"), lagging.client(t, "/target/stor-eu-1")}, d,
		slog.New(slog.NewTextHandler(logs, nil)), 0)
	if err := nextEvent(t, events); err != nil {
		t.Fatalf("the current replica's state: %v", err)
	}
	c, err := pb.NewAccessClient(current.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if d.host(c.Grant.HostNqn) == nil {
		t.Fatal("the granted host is not on the target")
	}
	waitFor(t, "the agent at the current store's revision", func() bool { return r.Revision() == current.db.Revision() })
	applied := r.Revision()
	d.mu.Lock()
	states := len(d.whole)
	d.mu.Unlock()
	for len(events) > 0 {
		<-events
	}

	if err := current.stop(); err != nil {
		t.Fatal(err)
	}
	// The agent moves to the lagging replica, whose state has no host:
	// refused (at its first heartbeat, which names its revision), every
	// time it tries.
	waitFor(t, "two refusals of the lagging replica", func() bool {
		return strings.Count(logs.String(), "older than revision") >= 2
	})
	select {
	case err := <-events:
		if err == nil || !errors.Is(err, targetagent.ErrStaleReplica) {
			t.Fatalf("the agent applied the lagging replica's state (store revision %d, after %d), or: %v", lagging.db.Revision(), applied, err)
		}
	default:
	}
	d.mu.Lock()
	after := len(d.whole)
	d.mu.Unlock()
	if after != states || d.host(c.Grant.HostNqn) == nil || r.Revision() != applied {
		t.Fatalf("the target lost the current state: host %v, revision %d (was %d)", d.host(c.Grant.HostNqn), r.Revision(), applied)
	}
}

// Issue 29, defect 7: an agent whose replica hangs (its connection open,
// nothing answered) leaves it once the heartbeats stop, and takes its
// state from the next replica — the target is not left with what the hung
// one last sent.
func TestAgentLeavesAHungReplica(t *testing.T) {
	beat := func(c *gateway.Config) { c.Heartbeat = 50 * time.Millisecond }
	hung, next := startGateway(t, beat), startGateway(t, beat)
	ctx := ctxT(t)
	for _, g := range []*testGateway{hung, next} {
		acmeInventory(t, g)
		g.remote.Store("stor-eu-1", true)
	}
	// The next replica is ahead (a job the hung one never saw).
	if _, err := pb.NewJobsClient(next.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	f := netfreeze.Start(t, hung.addr)
	svid, err := hung.ca.Issue(spiffeid.RequireFromPath(td, "/target/stor-eu-1"), time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	viaProxy := dial(t, f.Addr(), identity.StaticSource(svid, hung.ca.Bundle()))
	d := &recordingDriver{}
	logs := &logbuf.Buffer{}
	r, events := runAgent(t, []grpc.ClientConnInterface{viaProxy, next.client(t, "/target/stor-eu-1")}, d,
		slog.New(slog.NewTextHandler(logs, nil)), 300*time.Millisecond)
	waitFor(t, "the first replica's state applied", func() bool { return r.Revision() == hung.db.Revision() })
	f.Freeze()
	for i := 0; r.Revision() != next.db.Revision(); i++ {
		if i == 200 {
			t.Fatalf("the next replica's state not applied (agent at %d, next at %d):\n%s", r.Revision(), next.db.Revision(), logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = events
	if !bytes.Contains([]byte(logs.String()), []byte("no message for")) {
		t.Fatalf("the agent left the hung replica for another reason:\n%s", logs.String())
	}
}

// A replica that cannot pass its read barrier refuses a target agent's
// stream, and ends a live one at its next heartbeat: its copy may lack
// the others' changes (issue 29, defect 2).
func TestStreamRefusedWithoutTheReadBarrier(t *testing.T) {
	var cut atomic.Bool
	g := startGateway(t, func(c *gateway.Config) {
		c.Heartbeat = 50 * time.Millisecond
		c.ReadBarrier = func(context.Context) error {
			if cut.Load() {
				return errors.New("etcd unreachable")
			}
			return nil
		}
	})
	acmeInventory(t, g)
	g.remote.Store("stor-eu-1", true)
	ta := pb.NewTargetAgentClient(g.client(t, "/target/stor-eu-1"))
	ctx := ctxT(t)
	stream, err := ta.Watch(ctx, &pb.WatchRequest{AcceptDeltas: true, AcceptHeartbeats: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || !m.Heartbeat || m.StoreRevision != g.db.Revision() {
		t.Fatalf("first message %v, %v; want a heartbeat at revision %d", m, err, g.db.Revision())
	}
	cut.Store(true)
	for {
		m, err := stream.Recv()
		if err != nil {
			wantCode(t, err, codes.Unavailable, "cannot read the latest state", "another replica")
			break
		}
		if m.Heartbeat && m.StoreRevision == 0 {
			t.Fatal("a heartbeat without a revision")
		}
	}
	stream, err = ta.Watch(ctx, &pb.WatchRequest{AcceptDeltas: true, AcceptHeartbeats: true})
	if err == nil {
		_, err = stream.Recv()
	}
	wantCode(t, err, codes.Unavailable, "cannot read the latest state")
}
