package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// BenchmarkConnectUnderFlood measures the connects of well-behaved nodes
// (four node identities, each connecting again and again, one call at a
// time) first alone and then while one other node identity floods the
// gateway with slow calls: 512 of them kept under way, each held 100 ms
// after the limiter counted it (the read barrier holds it, standing in for
// any slow call) and then failing. It reports both p99s of the
// well-behaved connects and their ratio (issue 29, defect 9: the target is
// a ratio of at most 2), the flood's calls held on average, and its calls
// refused per second.
//
// single-pool is the limiter before the shares: one pool of 256 for every
// caller, the flood's calls past it waiting for a slot ahead of the nodes'.
// shares is the gateway as configured by default (an identity's share 32
// of 256); the flood sends a refused call again after 100 ms (a client
// backing off), or after 1 ms (as fast as it can: a flood of calls more
// than of slow ones).
//
//	go test -run '^$' -bench ConnectUnderFlood -benchtime 400x ./gateway
func BenchmarkConnectUnderFlood(b *testing.B) {
	single := func(c *gateway.Config) {
		c.MaxPerIdentity = -1
		c.MaxPerRole = map[string]int{"admin": -1, "auditor": -1, "scheduler": -1, "unknown": -1}
	}
	shares := func(*gateway.Config) {}
	for _, v := range []struct {
		name  string
		opt   gatewayOption
		calls int           // the flood's calls kept under way
		pause time.Duration // before a refused flood call is sent again
	}{
		{"single-pool", single, 512, 0},
		{"shares/32-calls", shares, 32, 0},
		{"shares/retry-100ms", shares, 512, 100 * time.Millisecond},
		{"shares/retry-1ms", shares, 512, time.Millisecond},
	} {
		b.Run(v.name, func(b *testing.B) { benchConnectUnderFlood(b, v.opt, v.calls, v.pause) })
	}
}

const (
	floodPath = "/node/acme-flood"
	floodHold = 100 * time.Millisecond
	victims   = 4
)

func benchConnectUnderFlood(b *testing.B, opt gatewayOption, calls int, pause time.Duration) {
	var held atomic.Int64 // the flood's calls held in the barrier now
	flooder := "spiffe://nvmegate.test" + floodPath
	slow := func(c *gateway.Config) {
		c.ReadBarrier = func(ctx context.Context) error {
			if id, _ := identity.PeerID(ctx); id.String() != flooder {
				return nil
			}
			held.Add(1)
			defer held.Add(-1)
			t := time.NewTimer(floodHold)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			return errors.New("held")
		}
	}
	g := startGateway(b, opt, slow)
	acmeInventory(b, g)
	ctx := b.Context()
	req := admitRequest("job-1")
	req.Nodes = nil
	for i := range victims {
		req.Nodes = append(req.Nodes, fmt.Sprintf("spiffe://nvmegate.test/node/acme-gpu-%d", i+1))
	}
	if _, err := pb.NewJobsClient(g.client(b, sched)).Admit(ctx, req); err != nil {
		b.Fatal(err)
	}
	var nodes []pb.AccessClient
	for i := range victims {
		nodes = append(nodes, pb.NewAccessClient(g.client(b, fmt.Sprintf("/node/acme-gpu-%d", i+1))))
	}
	connect := &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}
	// measure has the nodes make n connects, each node one at a time, and
	// adds their latencies to lat.
	measure := func(n int, lat *[]time.Duration) {
		var (
			mu sync.Mutex
			wg sync.WaitGroup
		)
		for i, c := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := i; j < n; j += victims {
					start := time.Now()
					if _, err := c.Connect(ctx, connect); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(start)
					mu.Lock()
					*lat = append(*lat, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	fc := pb.NewInventoryClient(g.client(b, floodPath))
	var (
		refused   atomic.Int64
		unwanted  atomic.Value
		refusedIn int64 // while measured
		heldSum   int64
		heldN     int64
		flooded   time.Duration
	)
	// flood keeps calls of one identity under way until the returned stop
	// is called.
	flood := func() (stop func()) {
		fctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for fctx.Err() == nil {
					_, err := fc.GetTarget(fctx, &pb.GetTargetRequest{Id: "stor-eu-1"})
					switch status.Code(err) {
					case codes.ResourceExhausted:
						refused.Add(1)
						time.Sleep(pause)
					case codes.Unavailable, codes.Canceled:
					default:
						unwanted.Store(fmt.Sprint(err))
					}
				}
			}()
		}
		// Until the flood holds what it can (its share, or the whole
		// pool), and a while more.
		for deadline := time.Now().Add(10 * time.Second); held.Load() < int64(min(calls, 32)) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2 * floodHold)
		wg.Add(1)
		go func() { // how many calls the flood holds, every 5 ms
			defer wg.Done()
			for fctx.Err() == nil {
				heldSum, heldN = heldSum+held.Load(), heldN+1
				time.Sleep(5 * time.Millisecond)
			}
		}()
		start, refused0 := time.Now(), refused.Load()
		return func() {
			flooded, refusedIn = flooded+time.Since(start), refusedIn+refused.Load()-refused0
			cancel()
			wg.Wait()
		}
	}
	// Rounds alone and under the flood take turns, so that whatever else
	// loads the machine weighs on both alike.
	const rounds = 4
	n := max(b.N/rounds, victims)
	var alone, loaded []time.Duration
	measure(victims, new([]time.Duration)) // connections made, caches warm
	b.ResetTimer()
	for range rounds {
		measure(n, &alone)
		stop := flood()
		measure(n, &loaded)
		stop()
	}
	b.StopTimer()
	if u := unwanted.Load(); u != nil {
		b.Fatalf("a flood call ended unexpectedly: %v", u)
	}
	p99 := func(lat []time.Duration) time.Duration {
		slices.Sort(lat)
		return lat[min(len(lat)-1, len(lat)*99/100)]
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms(p99(alone)), "p99-alone-ms")
	b.ReportMetric(ms(p99(loaded)), "p99-flood-ms")
	b.ReportMetric(float64(p99(loaded))/float64(p99(alone)), "p99-ratio")
	b.ReportMetric(float64(heldSum)/float64(max(heldN, 1)), "flood-held")
	b.ReportMetric(float64(refusedIn)/flooded.Seconds(), "flood-refused/s")
}

// BenchmarkOverShare is a call refused because its caller already has its
// share under way (one call, held): the cost an identity over its share
// imposes per call, beside BenchmarkDenied's (a call policy refuses, and
// its audit entry).
//
//	go test -run '^$' -bench 'OverShare|Denied' -benchtime 3000x ./gateway
func BenchmarkOverShare(b *testing.B) {
	h := newHolder(node)
	g := startGateway(b, h.option, func(c *gateway.Config) { c.MaxPerIdentity = 1 })
	inv := pb.NewInventoryClient(g.client(b, node))
	ctx := b.Context()
	done := hold(1, func() error { _, err := inv.GetTarget(ctx, &pb.GetTargetRequest{Id: "stor-eu-1"}); return err })
	<-h.entered
	req := &pb.GetTargetRequest{Id: "stor-eu-1"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := inv.GetTarget(ctx, req); status.Code(err) != codes.ResourceExhausted {
			b.Fatalf("over its share: %v", err)
		}
	}
	b.StopTimer()
	h.open(node)
	done()
}
