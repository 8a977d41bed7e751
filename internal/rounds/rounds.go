// Package rounds shares one run of an operation among the calls that wait
// for it: a read barrier that every call of a replica passes costs one
// read of etcd per round, not one per call.
package rounds

import (
	"context"
	"sync"
)

// Rounds runs an operation in rounds. A call waits for the next round that
// starts after it arrived, so the round's run sees everything that
// happened before the call; every call of a round gets that run's error.
// The zero value is ready to use.
type Rounds struct {
	mu      sync.Mutex
	running bool
	waiting []chan error
}

// Do waits for the next round of fn and returns its error, or ctx's. The
// first caller with no round running runs the rounds in a goroutine of
// its own, until none waits; fn must not block for ever (it bounds
// itself: a caller that gives up does not end the round).
func (r *Rounds) Do(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	r.mu.Lock()
	r.waiting = append(r.waiting, done)
	lead := !r.running
	r.running = true
	r.mu.Unlock()
	if lead {
		go r.run(fn)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Rounds) run(fn func() error) {
	for {
		r.mu.Lock()
		round := r.waiting
		r.waiting = nil
		if len(round) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		err := fn()
		for _, c := range round {
			c <- err
		}
	}
}
