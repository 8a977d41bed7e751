package store

import (
	"context"
	"sync"
)

// batcher groups concurrent writes into one transaction, so that a storm of
// connects pays one fsync per group rather than one each. Unlike bbolt's
// own Batch it adds no delay: a write arriving when none is committing
// commits at once; writes arriving during a commit go together in the next.
type batcher struct {
	mu      sync.Mutex
	pending []*batchCall
	running bool
}

type batchCall struct {
	fn   func(*txn) error
	done chan error
}

// batch runs fn in a write transaction shared with other concurrent
// callers. fn must be safe to run twice: if any function of a group fails,
// the group is rolled back (with the changes its functions recorded) and
// each function is run in a transaction of its own, so one caller's error
// never becomes another's.
func (db *DB) batch(ctx context.Context, fn func(*txn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if db.journal != nil {
		// The journal's writer groups concurrent changes into one commit,
		// and a refused one is undone alone.
		return db.propose(ctx, nil, fn)
	}
	c := &batchCall{fn: fn, done: make(chan error, 1)}
	b := &db.batcher
	b.mu.Lock()
	b.pending = append(b.pending, c)
	lead := !b.running
	b.running = true
	b.mu.Unlock()
	if lead {
		go db.drainBatches()
	}
	// Not abandoned on ctx: the write may already be committed, and the
	// caller must learn whether it was.
	return <-c.done
}

func (db *DB) drainBatches() {
	b := &db.batcher
	for {
		b.mu.Lock()
		calls := b.pending
		b.pending = nil
		if len(calls) == 0 {
			b.running = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		err := db.update(context.Background(), func(tx *txn) error {
			for _, c := range calls {
				if err := c.fn(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil && len(calls) > 1 {
			for _, c := range calls {
				c.done <- db.update(context.Background(), c.fn)
			}
			continue
		}
		for _, c := range calls {
			c.done <- err
		}
	}
}
