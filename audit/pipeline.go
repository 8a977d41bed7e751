package audit

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// flight is a commit sent to the Replica and not answered yet.
type flight struct {
	p    *prepared
	done chan error // the Replica's answer; buffered
}

// pipelinedWriter is the writer of a replica's copy. It keeps up to
// maxInFlight commits in the Replica at once, each built on the tree the
// one before it will make and carrying those still unanswered (Commit.Pending),
// so a commit that reaches the replica first stores them too. An append
// thus waits for about one round trip to the replica, not for the commit
// in flight and then for its own.
//
// Answers are taken in order: a commit's entries reach this copy, and its
// appenders their indexes, only after every commit before it. Other
// writers' commits (Sync) are applied only with nothing in flight: a
// waiting Sync holds new commits back until the flights land.
func (l *Log) pipelinedWriter() {
	defer close(l.done)
	var (
		inflight []*flight
		syncs    []chan error // Sync calls waiting for the flights to land
	)
	for {
		if len(inflight) == 0 && len(syncs) > 0 {
			err := l.syncNow()
			for _, done := range syncs {
				done <- err
			}
			syncs = nil
		}
		var (
			reqs <-chan *appendReq
			head <-chan error
		)
		if len(inflight) < maxInFlight && len(syncs) == 0 {
			reqs = l.reqs // a waiting Sync holds new commits back, or it could wait for ever
		}
		if len(inflight) > 0 {
			head = inflight[0].done
		}
		select {
		case done := <-l.syncs:
			syncs = append(syncs, done)
		case r := <-reqs:
			inflight = l.send(inflight, l.fill([]*appendReq{r}))
		case err := <-head:
			inflight = l.land(inflight, err)
		case <-l.stop:
			for len(inflight) > 0 {
				inflight = l.land(inflight, <-inflight[0].done)
			}
			for _, done := range syncs {
				done <- ErrClosed
			}
			l.commitQueued()
			return
		}
	}
}

// land takes the Replica's answer err to the first flight and returns
// the flights still in the Replica.
func (l *Log) land(inflight []*flight, err error) []*flight {
	if err != nil {
		l.settle(inflight, err)
		return nil
	}
	if l.store(inflight[0].p) != nil {
		for _, f := range inflight[1:] {
			<-f.done
			answer(f.p.batch, errBehind(f.p))
		}
		return nil
	}
	return inflight[1:]
}

// errBehind answers the appends of a commit after one that did not reach
// this copy. The replicated log may hold them: the next catch-up applies
// them as another writer's; they are not committed again.
func errBehind(p *prepared) error {
	return fmt.Errorf("%w: commit of %d entries at index %d: an earlier commit did not reach this copy; the replicated log may hold these entries", ErrUnavailable, len(p.batch), p.start)
}

// send sends batch to the Replica as the commit after those in flight.
func (l *Log) send(inflight []*flight, batch []*appendReq) []*flight {
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if failed != nil {
		answer(batch, failed)
		return inflight
	}
	var p *prepared
	var err error
	if n := len(inflight); n > 0 {
		last := inflight[n-1].p
		p, err = prepare(last.rng.End(), cloneRange(last.rng), batch)
	} else {
		l.stmu.RLock()
		start, rng := l.size, cloneRange(l.rng)
		l.stmu.RUnlock()
		p, err = prepare(start, rng, batch)
	}
	if err != nil {
		answer(batch, fmt.Errorf("%w: commit of %d entries: %w", ErrUnavailable, len(batch), err))
		return inflight
	}
	c := p.commit()
	for _, f := range inflight {
		c.Pending = append(c.Pending, f.p.commit())
	}
	f := &flight{p: p, done: make(chan error, 1)}
	go func() {
		ctx, cancel := l.replicaCtx()
		defer cancel()
		f.done <- l.opts.Replica.Append(ctx, c)
	}()
	return append(inflight, f)
}

// store writes a commit the Replica holds into this copy and answers its
// appenders. A failure is answered and the copy recovered: the entries
// are in the replicated log, and the next catch-up applies them.
func (l *Log) store(p *prepared) error {
	l.stmu.RLock()
	size := l.size
	l.stmu.RUnlock()
	err := fmt.Errorf("%w: this copy ends at %d, the commit starts at %d", ErrCorrupt, size, p.start)
	if size == p.start {
		flush := l.flushDue(len(p.batch))
		l.dbmu.RLock()
		err = l.db.Update(func(tx *bolt.Tx) error { return l.put(tx, p, flush) })
		l.dbmu.RUnlock()
		if err == nil {
			l.advance(p.start, p.rng, p.batch, flush)
			for i, r := range p.batch {
				r.done <- appendResult{index: p.start + uint64(i)}
			}
			return nil
		}
	}
	err = fmt.Errorf("%w: commit of %d entries at index %d: %w", ErrUnavailable, len(p.batch), p.start, err)
	answer(p.batch, err)
	l.recoverAfter(err)
	return err
}

// settle ends the flights after the first one's failed answer err. It
// waits for the others' answers: those up to the last one stored are
// stored (that commit carried them), and the rest committed again one at
// a time, as the single-commit writer does: after catching up with
// another writer, or without the appends whose condition failed. A
// commit again at the same place is not a duplicate: the Replica answers
// that it holds it already if an answer was lost.
func (l *Log) settle(inflight []*flight, err error) {
	errs := make([]error, len(inflight))
	errs[0] = err
	for i, f := range inflight[1:] {
		errs[i+1] = <-f.done
	}
	last := -1
	for i, e := range errs {
		if e == nil {
			last = i
		}
	}
	for i, f := range inflight {
		if i > last {
			l.commit(f.p.batch)
			continue
		}
		if l.store(f.p) != nil {
			for _, g := range inflight[i+1:] {
				answer(g.p.batch, errBehind(g.p))
			}
			return
		}
	}
}

// answer fails every request of batch with err.
func answer(batch []*appendReq, err error) {
	for _, r := range batch {
		r.done <- appendResult{err: err}
	}
}
