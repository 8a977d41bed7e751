package rounds

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// Calls that arrive while a round runs share the next one: many callers,
// few runs, and each run sees every call that arrived before it began.
func TestCallsShareRounds(t *testing.T) {
	var r Rounds
	var runs, arrived, seen atomic.Int64
	release := make(chan struct{})
	first := true
	fn := func() error {
		runs.Add(1)
		if first {
			first = false
			<-release // hold the first round while the others queue
		}
		seen.Store(arrived.Load())
		return nil
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Do(context.Background(), fn) }()
	for runs.Load() == 0 {
	}
	for range 50 {
		wg.Add(1)
		n := arrived.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Do(context.Background(), fn); err != nil {
				t.Error(err)
			}
			if s := seen.Load(); s < n {
				t.Errorf("a round saw %d arrivals, the caller was the %dth", s, n)
			}
		}()
	}
	// Every other call queued behind the held round: one more round
	// answers them all.
	for queued := 0; queued < 50; {
		r.mu.Lock()
		queued = len(r.waiting)
		r.mu.Unlock()
	}
	close(release)
	wg.Wait()
	if n := runs.Load(); n != 2 {
		t.Fatalf("%d runs for 51 calls, 50 of them queued behind the first", n)
	}
}

// A round's error reaches every call of the round; a caller whose context
// ends stops waiting.
func TestRoundErrorAndCancel(t *testing.T) {
	var r Rounds
	boom := errors.New("boom")
	if err := r.Do(context.Background(), func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	block := make(chan struct{})
	defer close(block)
	if err := r.Do(ctx, func() error { <-block; return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled caller: %v", err)
	}
}
