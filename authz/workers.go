package authz

import (
	"context"
	"runtime"
	"sync"
)

// workers runs the evaluations that recurse deeply (a full decision, a
// scope or caller decision the memos miss) on a few long-lived goroutines.
//
// OPA's evaluator recurses a continuation per expression: a caller
// decision grows a goroutine's stack to tens of KiB. gRPC runs a call on a
// fresh goroutine whenever its pooled handlers are busy — in a connect
// storm, nearly every call — and each fresh goroutine grew its stack by
// copying, doubling after doubling: 30 % of the gateway's CPU in a
// 10,000-node storm (pprof: runtime.copystack under OPA frames), and the
// grown stacks of thousands of waiting calls pressed the heap against its
// memory limit. A worker's stack grows once and serves every evaluation
// after; the work is CPU-bound, so a few workers per core lose nothing to
// waiting. The node decision of a warm call (a handful of expressions)
// stays on the caller's goroutine: a handoff would cost it more than its
// stack does.
type workers struct {
	once sync.Once
	work chan func()
}

// workersPerCore bounds the evaluations in progress: enough that one
// waiting on the scheduler does not idle a core, few enough that their
// stacks stay a small, fixed cost.
const workersPerCore = 4

func (w *workers) start() {
	n := workersPerCore * runtime.GOMAXPROCS(0)
	w.work = make(chan func())
	for range n {
		go func() {
			for f := range w.work {
				f()
			}
		}()
	}
}

// do runs f on a worker and returns when it is done, or ctx's error if ctx
// ended before a worker took f (a call that is over gets no evaluation).
// f must not block on anything but CPU. A panic in f is raised again on
// the caller's goroutine, where the gateway's recovery sees it, instead of
// ending the process from a worker.
func (w *workers) do(ctx context.Context, f func()) error {
	w.once.Do(w.start)
	var panicked any
	done := make(chan struct{})
	run := func() {
		defer close(done)
		defer func() { panicked = recover() }()
		f()
	}
	select {
	case w.work <- run:
	case <-ctx.Done():
		return ctx.Err()
	}
	<-done
	if panicked != nil {
		panic(panicked)
	}
	return nil
}
