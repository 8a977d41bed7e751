package gateway

import (
	"context"
	"sync/atomic"

	"github.com/nvmegate/nvmegate"
)

// Default bounds of the call limiter (Config.MaxInFlight, MaxWaiting).
const (
	defaultMaxInFlight = 256
	defaultMaxWaiting  = 16384
)

// limiter bounds the unary calls doing work at once. A call past the bound
// waits (its goroutine and decoded request are all it holds) until a slot
// frees or its deadline ends; past MaxWaiting waiting calls it is refused
// Unavailable at once. Found under a 10,000-node connect storm: unbounded,
// every call describing and evaluating at the same time took the gateway
// past 20 GB and the kernel killed it.
type limiter struct {
	slots      chan struct{}
	waiting    atomic.Int64
	maxWaiting int64
}

func newLimiter(inFlight, waiting int) *limiter {
	if inFlight <= 0 {
		inFlight = defaultMaxInFlight
	}
	if waiting <= 0 {
		waiting = defaultMaxWaiting
	}
	return &limiter{slots: make(chan struct{}, inFlight), maxWaiting: int64(waiting)}
}

// acquire takes a slot; release gives it back.
func (l *limiter) acquire(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	if l.waiting.Add(1) > l.maxWaiting {
		l.waiting.Add(-1)
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "gateway busy: too many calls waiting; retry with backoff")
	}
	defer l.waiting.Add(-1)
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *limiter) release() { <-l.slots }
