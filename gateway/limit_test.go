package gateway

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nvmegate/nvmegate"
)

// Calls past the in-flight bound wait for a slot (or their deadline), and
// past the waiting bound they are refused Unavailable at once.
func TestLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(2, 1)
		ctx := context.Background()
		for range 2 {
			if err := l.acquire(ctx); err != nil {
				t.Fatal(err)
			}
		}
		got := make(chan error, 1)
		go func() { got <- l.acquire(ctx) }() // waits
		synctest.Wait()
		if err := l.acquire(ctx); nvmegate.ErrorCode(err) != nvmegate.EUNAVAILABLE {
			t.Fatalf("a call past the waiting bound: %v, want Unavailable", err)
		}
		select {
		case err := <-got:
			t.Fatalf("the waiting call got a slot while none was free: %v", err)
		default:
		}
		l.release()
		if err := <-got; err != nil {
			t.Fatalf("the waiting call: %v", err)
		}
		// A waiting call gives up at its deadline.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := l.acquire(dctx); err != context.DeadlineExceeded {
			t.Fatalf("at its deadline: %v", err)
		}
	})
}
