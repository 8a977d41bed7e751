package gateway_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// raceDuration is how long TestTwoAgentsOfOneTarget churns: 60 s, 5 s
// with -short, or NVMEGATE_AGENT_RACE (a Go duration).
func raceDuration(t *testing.T) time.Duration {
	if v := os.Getenv("NVMEGATE_AGENT_RACE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("NVMEGATE_AGENT_RACE: %v", err)
		}
		return d
	}
	if testing.Short() {
		return 5 * time.Second
	}
	return 60 * time.Second
}

// Two agents of one target (two instances on its storage server, writing
// one nvmet tree) race and restart for a minute while nodes connect and
// release. No release is answered as done while its host is still on the
// target, no connect is answered before the target has the host, and once
// the churn stops the target's host set converges to exactly the active
// grants, with no removal left pending.
func TestTwoAgentsOfOneTarget(t *testing.T) {
	d := raceDuration(t)
	g := startGateway(t)
	acmeInventory(t, g)
	const nodes = 6
	req := admitRequest("job-1")
	req.Nodes = nil
	for i := range nodes {
		req.Nodes = append(req.Nodes, fmt.Sprintf("spiffe://nvmegate.test/node/acme-gpu-%d", i+1))
	}
	req.ExpiresAt = timestamppb.New(time.Now().Add(2*time.Hour + d))
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	g.remote.Store("stor-eu-1", true)
	root := t.TempDir()
	allowed := func(host string) bool {
		_, err := os.Lstat(filepath.Join(root, "subsystems", subNQN, "allowed_hosts", host))
		return err == nil
	}

	ctx, stop := context.WithTimeout(context.Background(), d)
	defer stop()
	var wg sync.WaitGroup
	// The agents: each runs for 0.1-2 s (a restart: a new process, a new
	// driver that remembers nothing), pauses up to 0.3 s, and again.
	var lives atomic.Int64
	for slot := range 2 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(slot), 7))
			for ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, time.Duration(100+rng.IntN(1900))*time.Millisecond)
				(&targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"), Driver: &nvmet.Driver{Root: root}}).Run(rctx)
				cancel()
				lives.Add(1)
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
			}
		})
	}
	// The nodes: connect, then release (or connect again, superseding),
	// each checking the target at the answer.
	var (
		mu                   sync.Mutex
		violations           []string
		connects, releases   atomic.Int64
		refusedC, refusedRel atomic.Int64
	)
	violate := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(violations) < 10 {
			violations = append(violations, fmt.Sprintf(format, a...))
		}
	}
	for i := range nodes {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			ac := pb.NewAccessClient(g.client(t, fmt.Sprintf("/node/acme-gpu-%d", i+1)))
			var held *pb.Grant
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if held != nil && rng.IntN(2) == 0 {
					_, err := ac.Release(cctx, &pb.ReleaseRequest{GrantId: held.GrantId})
					switch status.Code(err) {
					case codes.OK:
						releases.Add(1)
						if allowed(held.HostNqn) {
							violate("release of %s answered OK, host %s still allowed", held.GrantId, held.HostNqn)
						}
						held = nil
					case codes.Unavailable:
						refusedRel.Add(1) // pending removal: retried next turn
					default:
						violate("release: %v", err)
					}
				} else {
					resp, err := ac.Connect(cctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
					switch status.Code(err) {
					case codes.OK:
						connects.Add(1)
						// The node's own grants change only by its own
						// calls, made in turn: its host must be there.
						if !allowed(resp.Grant.HostNqn) {
							violate("connect %s answered before the target allowed %s", resp.Grant.GrantId, resp.Grant.HostNqn)
						}
						held = resp.Grant
					case codes.Unavailable:
						refusedC.Add(1)
					default:
						violate("connect: %v", err)
					}
				}
				cancel()
				time.Sleep(time.Duration(rng.IntN(50)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	t.Logf("%s of churn: %d agent lives; %d connects (%d refused), %d releases (%d pending when answered)",
		d, lives.Load(), connects.Load(), refusedC.Load(), releases.Load(), refusedRel.Load())
	for _, v := range violations {
		t.Error(v)
	}
	if connects.Load() == 0 || releases.Load() == 0 {
		t.Fatal("the churn granted or released nothing: it tested nothing")
	}

	// The churn is over: one agent runs. Pending removals settle and the
	// target converges to the store.
	waitApplied(t, startRemote(t, g, "stor-eu-1", &nvmet.Driver{Root: root}))
	ctx = ctxT(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := g.lease.Settle(ctx)
		if n == 0 && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removals still pending: %d, %v", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := g.agent.Program(ctx, "stor-eu-1"); err != nil {
		t.Fatal(err)
	}
	active, err := store.All(func(p store.Page) ([]*pb.Grant, string, error) {
		r, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{State: pb.GrantState_GRANT_STATE_ACTIVE, PageToken: p.Token})
		if err != nil {
			return nil, "", err
		}
		return r.Grants, r.NextPageToken, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, gr := range active {
		want = append(want, gr.HostNqn)
	}
	slices.Sort(want)
	var got []string
	ents, _ := os.ReadDir(filepath.Join(root, "subsystems", subNQN, "allowed_hosts"))
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the target allows %v, the active grants are those of %v", got, want)
	}
	var hosts []string
	ents, _ = os.ReadDir(filepath.Join(root, "hosts"))
	for _, e := range ents {
		hosts = append(hosts, e.Name())
	}
	if !slices.Equal(hosts, want) {
		t.Fatalf("the target keys hosts %v, the active grants are those of %v", hosts, want)
	}
	pending, _, err := g.db.ListGrants(ctx, store.GrantFilter{RemovalPending: true}, store.Page{})
	if err != nil || len(pending) != 0 {
		t.Fatalf("removals pending after convergence: %d %v", len(pending), err)
	}
}
