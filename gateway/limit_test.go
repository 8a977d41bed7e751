package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/peer"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/identity"
)

func mustLimiter(t testing.TB, c limits) *limiter {
	t.Helper()
	l, err := newLimiter(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// callerCtx is a call's context as the gRPC server gives it to the
// interceptors: its peer carries the SPIFFE ID the handshake verified.
func callerCtx(ctx context.Context, path string) context.Context {
	id := spiffeid.RequireFromPath(spiffeid.RequireTrustDomainFromString("nvmegate.test"), path)
	return peer.NewContext(ctx, &peer.Peer{AuthInfo: identity.AuthInfo{ID: id}})
}

// noRoleShares lifts every role's default bound: the single pool of before.
var noRoleShares = map[string]int{"admin": -1, "auditor": -1, "scheduler": -1, "unknown": -1}

// Calls past the in-flight bound wait for a slot (or their deadline), and
// past the waiting bound they are refused Unavailable at once.
func TestLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustLimiter(t, limits{inFlight: 2, waiting: 1, perIdentity: -1, perRole: noRoleShares})
		ctx := context.Background()
		for range 2 {
			if _, err := l.acquire(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := make(chan error, 1)
		go func() { _, err := l.acquire(ctx); got <- err }() // waits
		synctest.Wait()
		if _, err := l.acquire(ctx); nvmegate.ErrorCode(err) != nvmegate.EUNAVAILABLE {
			t.Fatalf("a call past the waiting bound: %v, want Unavailable", err)
		}
		select {
		case err := <-got:
			t.Fatalf("the waiting call got a slot while none was free: %v", err)
		default:
		}
		l.release(share{})
		if err := <-got; err != nil {
			t.Fatalf("the waiting call: %v", err)
		}
		// A waiting call gives up at its deadline.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := l.acquire(dctx); err != context.DeadlineExceeded {
			t.Fatalf("at its deadline: %v", err)
		}
	})
}

// One identity's calls under way (working or waiting for a slot) are
// bounded by its share: the next is refused ResourceExhausted at once,
// naming the bound, while the pool still has room for another caller. A
// role's callers together are bounded by the role's share. Every counter
// is back to zero once the calls have ended, whether they got a slot, gave
// up waiting or were refused.
func TestLimiterShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustLimiter(t, limits{inFlight: 4, waiting: 100, perIdentity: 3, perRole: map[string]int{"auditor": 2}})
		bg := context.Background()
		n1, n2 := callerCtx(bg, "/node/gpu-1"), callerCtx(bg, "/node/gpu-2")

		var held []share
		take := func(ctx context.Context) {
			t.Helper()
			sh, err := l.acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, sh)
		}
		take(n1)
		take(n1)
		take(n2)
		take(n2) // the pool is full
		// gpu-1's third call waits for a slot, within its share.
		wctx, cancel := context.WithCancel(n1)
		waited := make(chan error, 1)
		go func() { _, err := l.acquire(wctx); waited <- err }()
		synctest.Wait()
		// Its fourth is over its share: refused, not queued.
		_, err := l.acquire(n1)
		if nvmegate.ErrorCode(err) != nvmegate.EEXHAUSTED || !strings.Contains(err.Error(), "per-identity bound") {
			t.Fatalf("over the identity's share: %v", err)
		}
		// The waiting call gives up: its share is given back.
		cancel()
		if err := <-waited; err != context.Canceled {
			t.Fatalf("the canceled waiting call: %v", err)
		}
		if n, _ := l.underWay(); n != 2 {
			t.Fatalf("%d identities under way, want 2", n)
		}
		for _, sh := range held {
			l.release(sh)
		}
		held = nil

		// Two auditors fill the role's share; a third auditor is refused
		// although it has no call of its own, an admin is not.
		take(callerCtx(bg, "/auditor/a"))
		take(callerCtx(bg, "/auditor/b"))
		_, err = l.acquire(callerCtx(bg, "/auditor/c"))
		if nvmegate.ErrorCode(err) != nvmegate.EEXHAUSTED || !strings.Contains(err.Error(), "role auditor") {
			t.Fatalf("over the role's share: %v", err)
		}
		take(callerCtx(bg, "/admin/ops"))
		for _, sh := range held {
			l.release(sh)
		}
		if n, roles := l.underWay(); n != 0 || len(roles) != 0 {
			t.Fatalf("after every call ended: %d identities, roles %v", n, roles)
		}
	})
}

// The defaults: an identity gets an eighth of the pool, admins, auditors
// and schedulers a quarter each, unknown callers a sixteenth; nodes and
// target agents have no role bound. A negative bound lifts one; a role
// policy does not know is refused.
func TestLimiterDefaults(t *testing.T) {
	l := mustLimiter(t, limits{inFlight: 256})
	want := map[string]int{"admin": 64, "auditor": 64, "scheduler": 64, "unknown": 16}
	for i, r := range roles {
		if l.perRole[i] != want[r] {
			t.Errorf("role %s: bound %d, want %d", r, l.perRole[i], want[r])
		}
	}
	if l.perIdentity != 32 || !l.shares {
		t.Errorf("per identity %d (shares %v), want 32", l.perIdentity, l.shares)
	}
	off := mustLimiter(t, limits{perIdentity: -1, perRole: noRoleShares})
	if off.shares {
		t.Errorf("every share lifted, still counted: %+v", off.perRole)
	}
	if _, err := newLimiter(limits{perRole: map[string]int{"operator": 1}}); err == nil {
		t.Error("an unknown role was accepted")
	}
}

// Taking and giving back a share allocates nothing: every call does it.
func TestLimiterAllocs(t *testing.T) {
	l := mustLimiter(t, limits{})
	for _, path := range []string{"/node/gpu-1", "/tenant/acme/scheduler/slurm", "/target/stor-1", "/x/y/z/v/w"} {
		ctx := callerCtx(context.Background(), path)
		if n := testing.AllocsPerRun(1000, func() {
			sh, err := l.acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l.release(sh)
		}); n != 0 {
			t.Errorf("%s: %v allocations per call", path, n)
		}
	}
}

// BenchmarkLimiter is a call's acquire and release of its share and slot,
// by callers spread over many identities and by one identity alone (one
// counter, the most contended), against the single pool without shares.
//
//	go test -run '^$' -bench Limiter -cpu 1,2 ./gateway
func BenchmarkLimiter(b *testing.B) {
	ctxs := make([]context.Context, 64)
	for i := range ctxs {
		ctxs[i] = callerCtx(context.Background(), fmt.Sprintf("/node/gpu-%d", i))
	}
	for _, bc := range []struct {
		name string
		l    limits
		ids  int
	}{
		{"shares/64-identities", limits{inFlight: 1 << 16}, 64},
		{"shares/1-identity", limits{inFlight: 1 << 16, perIdentity: 1 << 16}, 1},
		{"single-pool", limits{inFlight: 1 << 16, perIdentity: -1, perRole: noRoleShares}, 64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := mustLimiter(b, bc.l)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					sh, err := l.acquire(ctxs[i%bc.ids])
					if err != nil {
						b.Error(err)
						return
					}
					l.release(sh)
					i++
				}
			})
		})
	}
}
