package audit

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/transparency-dev/merkle/compact"
	bolt "go.etcd.io/bbolt"
)

// flight is a commit sent to the Replica.
type flight struct {
	p        *prepared
	done     chan error // the Replica's answer; buffered
	answered bool       // err holds the answer, taken from done
	err      error
}

// take records f's answer if it has come, or waits for it.
func (f *flight) take(wait bool) {
	if f.answered {
		return
	}
	if wait {
		f.err, f.answered = <-f.done, true
		return
	}
	select {
	case f.err = <-f.done:
		f.answered = true
	default:
	}
}

// pipelinedWriter is the writer of a replica's copy. It keeps up to
// Options.ReplicaInFlight commits in the Replica at once (one by
// default), each built on the tree the one before it will make and
// carrying those still unanswered (Commit.Pending), so a commit that
// reaches the replica first stores them too.
//
// It works in two stages: once the Replica holds a commit, the next one
// (if appends wait) is sent, built on it, before this copy stores it, so
// that the Replica's round and this copy's commit (each with its fsyncs)
// overlap instead of taking turns (chain). Proposals are prepared on top
// of the one being stored, as the store's open transaction allows; a
// proposal that needs its state durable first (Drainer) waits.
//
// Commits reach this copy, and their appenders their indexes, in order,
// as soon as one is answered as stored: it holds every commit before it,
// whose own answers (the overtaken one's is a refused compare, a whole
// round in the replica) are not waited for. Other writers' commits (Sync)
// are applied only with nothing in flight: a waiting Sync holds new
// commits back until the flights land.
func (l *Log) pipelinedWriter() {
	defer close(l.done)
	var (
		inflight []*flight
		syncs    []chan error             // Sync calls waiting for the flights to land
		csyncs   []chan error             // SyncCommits calls, likewise
		wake     = make(chan struct{}, 1) // an answer came
		round    int                      // appends of the last round: those it answered and those queued meanwhile
	)
	for {
		if len(inflight) == 0 && len(l.queued) > 0 {
			inflight = l.dispatchQueued(wake)
		}
		if len(inflight) == 0 && len(syncs)+len(csyncs) > 0 {
			err := l.syncNow(len(syncs) == 0) // a full one answers both
			for _, done := range append(syncs, csyncs...) {
				done <- err
			}
			syncs, csyncs = nil, nil
		}
		var reqs <-chan *appendReq
		if l.room(inflight) && len(syncs)+len(csyncs) == 0 && len(l.queued) == 0 {
			reqs = l.reqs // a waiting Sync holds new commits back, or it could wait for ever
		}
		var offers <-chan []Commit
		if len(inflight) == 0 {
			offers = l.offers // applied between this writer's own commits
		}
		select {
		case done := <-l.syncs:
			syncs = append(syncs, done)
		case done := <-l.csyncs:
			csyncs = append(csyncs, done)
		case cs := <-offers:
			l.applyOffered(cs)
		case r := <-reqs:
			batch := l.gather(l.fill([]*appendReq{r}), round)
			round = len(batch)
			inflight = l.send(inflight, batch, wake, nil)
		case <-wake:
			landed, rest := l.answered(inflight, false)
			if n := pendingAppends(landed); n > 0 {
				round = n + len(l.reqs) // those it answers and those queued meanwhile
			}
			var held *appendReq
			switch {
			case len(landed) == 0 || len(rest) > 0:
			case len(l.queued) > 0:
				rest = l.dispatchQueued(wake) // the next part of the batch, prepared
			case len(syncs)+len(csyncs) == 0:
				rest, held = l.chain(landed[len(landed)-1].p, round, wake)
			}
			inflight = l.storeLanded(landed, rest)
			if held != nil {
				batch := l.gather(l.fill([]*appendReq{held}), round)
				round = len(batch)
				inflight = l.send(inflight, batch, wake, nil)
			}
		case <-l.stop:
			for len(inflight) > 0 || len(l.queued) > 0 {
				if len(inflight) == 0 {
					inflight = l.dispatchQueued(wake)
				}
				inflight = l.land(inflight, true)
			}
			for _, done := range append(syncs, csyncs...) {
				done <- ErrClosed
			}
			l.commitQueued()
			return
		}
	}
}

// gather waits for more appends while batch holds fewer than the last
// round (the appends it answered and those queued meanwhile): an appender
// just answered often appends again at once (a connect's next entry, a
// client in a loop), and a commit cut without it makes it wait for a whole
// round of the replica and then its own. It waits while appends keep
// coming, each within l.gap of the one before, and GroupWait in all; the
// replica is idle meanwhile, so the wait is a fraction of its round. This
// is group commit's delay (MySQL's binlog_group_commit_sync_delay with its
// no_delay_count; PostgreSQL's commit_delay).
//
// It polls, yielding, rather than sleeping on a timer: the runtime's
// timers wake an idle process a millisecond late at best (its poller
// waits whole milliseconds), which made every commit with no append
// coming a millisecond late (p50 2.3 → 3.3 ms at 1,000 appends/s, open
// loop). The poll spends at most the gap of one core per commit.
func (l *Log) gather(batch []*appendReq, round int) []*appendReq {
	if l.opts.GroupWait <= 0 || len(batch) >= round {
		return batch
	}
	bytes := 0
	for _, r := range batch {
		bytes += 2 + len(r.data)
	}
	last := time.Now()
	deadline := last.Add(l.opts.GroupWait)
	for len(batch) < round && len(batch) < l.maxBatch && bytes < l.maxBatchBytes() {
		select {
		case r := <-l.reqs:
			batch = append(batch, r)
			bytes += 2 + len(r.data)
			last = time.Now()
		default:
			now := time.Now()
			if now.Sub(last) >= l.gap || now.After(deadline) {
				return batch
			}
			runtime.Gosched()
		}
	}
	return batch
}

// pendingAppends counts the appends of the flights.
func pendingAppends(inflight []*flight) int {
	n := 0
	for _, f := range inflight {
		n += len(f.p.batch)
	}
	return n
}

// room says whether another commit may be sent now. (Sending more while
// the oldest is stalled in the replica was tried: more, smaller commits
// made every round of etcd slower, p99 1.3–1.6× worse at 16 appenders.)
func (l *Log) room(inflight []*flight) bool {
	carried := 0
	for _, f := range inflight {
		if len(f.p.props) > 0 {
			// Proposals are prepared on the tree their commit extends
			// and undone in reverse if it fails: their commit flies
			// alone.
			return false
		}
		carried += len(f.p.chunk)
	}
	return len(inflight) == 0 || len(inflight) < l.opts.ReplicaInFlight && carried <= maxCarriedBytes
}

// land takes the answers that have come (all, with wait) and returns the
// flights still in the Replica. The last one stored and those before it
// reach this copy; a refused first one settles them all.
func (l *Log) land(inflight []*flight, wait bool) []*flight {
	return l.storeLanded(l.answered(inflight, wait))
}

// answered takes the answers that have come (all, with wait) and splits
// the flights into those the Replica holds (the last one answered as
// stored and those before it: that commit carried them) and the rest.
func (l *Log) answered(inflight []*flight, wait bool) (landed, rest []*flight) {
	last := -1
	for i, f := range inflight {
		f.take(wait)
		if f.answered && f.err == nil {
			last = i
		}
	}
	return inflight[:last+1], inflight[last+1:]
}

// storeLanded stores the landed flights in this copy, in order, and
// returns the flights still in the Replica; a refused first one settles
// them all. If a store fails, every flight after it fails too: each was
// built on it.
func (l *Log) storeLanded(landed, rest []*flight) []*flight {
	for i, f := range landed {
		if l.store(f.p) != nil {
			for _, g := range append(landed[i+1:len(landed):len(landed)], rest...) {
				g.take(true)
				answer(g.p.batch, errBehind(g.p))
				finish(g.p.props, errBehind(g.p))
			}
			l.failQueued()
			return nil
		}
	}
	if len(rest) > 0 && rest[0].answered {
		l.settle(rest)
		l.failQueued()
		return nil
	}
	return rest
}

// dispatchQueued sends the next part of a batch cut in parts, prepared
// on the one before it, which the Replica holds.
func (l *Log) dispatchQueued(wake chan<- struct{}) []*flight {
	p := l.queued[0]
	l.queued = l.queued[1:]
	return l.dispatch(nil, p, wake)
}

// failQueued fails the parts not yet sent: each was built on a commit
// that did not reach this copy.
func (l *Log) failQueued() {
	for i := len(l.queued) - 1; i >= 0; i-- {
		p := l.queued[i]
		answer(p.batch, errBehind(p))
		finish(p.props, errBehind(p))
	}
	l.queued = nil
}

// A Drainer is a Proposal that may need the changes before it durable in
// this copy before it is prepared (its state checkpointed, readers let
// in): the writer then stores what the Replica holds first instead of
// preparing it on top (chain).
type Drainer interface {
	DrainFirst() bool
}

// chain sends the next commit, if an append waits, built on base: a
// commit the Replica holds and this copy has yet to store. It returns the
// flight, or the append it took if that is a proposal that wants the
// copy drained first (sent once base is stored).
func (l *Log) chain(base *prepared, round int, wake chan<- struct{}) ([]*flight, *appendReq) {
	var r *appendReq
	select {
	case r = <-l.reqs:
	default:
		return nil, nil
	}
	if d, ok := r.prop.(Drainer); ok && d.DrainFirst() {
		return nil, r
	}
	return l.send(nil, l.gather(l.fill([]*appendReq{r}), round), wake, base), nil
}

// errBehind answers the appends of a commit after one that did not reach
// this copy. The replicated log may hold them: the next catch-up applies
// them as another writer's; they are not committed again.
func errBehind(p *prepared) error {
	return fmt.Errorf("%w: commit of %d entries at index %d: an earlier commit did not reach this copy; the replicated log may hold these entries", ErrUnavailable, len(p.batch), p.start)
}

// send sends batch to the Replica as the commit after those in flight, or,
// with none, after base (a commit the Replica holds that this copy has
// yet to store), or after this copy.
func (l *Log) send(inflight []*flight, batch []*appendReq, wake chan<- struct{}, base *prepared) []*flight {
	l.closeMu.RLock()
	failed := l.failed
	l.closeMu.RUnlock()
	if failed != nil {
		answer(batch, failed)
		return inflight
	}
	var start uint64
	var rng *compact.Range
	if n := len(inflight); n > 0 {
		last := inflight[n-1].p
		start, rng = last.rng.End(), cloneRange(last.rng)
	} else if base != nil {
		start, rng = base.rng.End(), cloneRange(base.rng)
	} else {
		l.stmu.RLock()
		start, rng = l.size, cloneRange(l.rng)
		l.stmu.RUnlock()
	}
	var props []proposed
	if hasProposal(batch) {
		if len(inflight) > 0 {
			// A proposal flies alone: the flights before it land first
			// (it may still be prepared on a commit this copy has yet
			// to store: chain).
			for len(inflight) > 0 {
				inflight = l.land(inflight, true)
			}
			l.stmu.RLock()
			start, rng = l.size, cloneRange(l.rng)
			l.stmu.RUnlock()
		}
		if batch, props = l.expand(start, batch); len(batch) == 0 {
			return inflight
		}
	}
	var ps []*prepared
	parts := l.parts(start, batch, props)
	for i, part := range parts {
		p, err := prepare(start, rng, part.batch)
		if err != nil {
			// This part and those after it: the earlier ones go.
			err = fmt.Errorf("%w: commit of %d entries: %w", ErrUnavailable, len(part.batch), err)
			for k := len(parts) - 1; k >= i; k-- {
				answer(parts[k].batch, err)
				finish(parts[k].props, err)
			}
			break
		}
		p.props = part.props
		ps = append(ps, p)
		start, rng = p.rng.End(), cloneRange(p.rng)
	}
	if len(ps) == 0 {
		return inflight
	}
	// The parts after the first follow it one per round (dispatchQueued).
	l.queued = append(l.queued, ps[1:]...)
	return l.dispatch(inflight, ps[0], wake)
}

// part is a run of a batch that fits one request to the Replica.
type part struct {
	batch []*appendReq
	props []proposed
}

// parts cuts batch, which starts at index start and holds props, into
// runs that each fit the Replica's request limit with their proposals'
// payloads (gather bounds the entries only: a payload is known once its
// proposal is prepared). A proposal's entries stay together; a unit
// larger than the limit goes alone.
func (l *Log) parts(start uint64, batch []*appendReq, props []proposed) []part {
	limit := l.maxBatchBytes()
	var (
		out   []part
		cur   part
		bytes int
		j     int // the next proposal
	)
	for i := 0; i < len(batch); {
		n, size, pr := 1, 2+len(batch[i].data), []proposed(nil)
		if j < len(props) && props[j].first == start+uint64(i) {
			n, pr = props[j].n, props[j:j+1]
			size = 21 + len(props[j].payload)
			for _, r := range batch[i : i+n] {
				size += 2 + len(r.data)
			}
			j++
		}
		if len(cur.batch) > 0 && bytes+size > limit {
			out = append(out, cur)
			cur, bytes = part{}, 0
		}
		cur.batch = append(cur.batch, batch[i:i+n]...)
		cur.props = append(cur.props, pr...)
		bytes += size
		i += n
	}
	if j < len(props) {
		// A proposal not where its index says (not expand's batch):
		// one commit, as before parts, rather than lose its answer.
		return []part{{batch: batch, props: props}}
	}
	return append(out, cur)
}

// dispatch sends p, prepared on the tree the flights before it make, to
// the Replica.
func (l *Log) dispatch(inflight []*flight, p *prepared, wake chan<- struct{}) []*flight {
	c := p.commit()
	for _, f := range inflight {
		c.Pending = append(c.Pending, f.p.commit())
	}
	f := &flight{p: p, done: make(chan error, 1)}
	go func() {
		ctx, cancel := l.replicaCtx()
		defer cancel()
		f.done <- l.countLost(l.opts.Replica.Append(ctx, c))
		select {
		case wake <- struct{}{}:
		default: // a wake-up is pending: the writer looks at every flight
		}
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
			finish(p.props, nil)
			l.stored(p.props)
			return nil
		}
	}
	err = fmt.Errorf("%w: commit of %d entries at index %d: %w", ErrUnavailable, len(p.batch), p.start, err)
	answer(p.batch, err)
	// The Replica holds the changes: the proposals are durable, and
	// this copy's next catch-up applies them. Their proposer may not
	// undo them: it is told they failed only if it can be kept from
	// using them (fail closed: its store stops sequencing).
	finish(p.props, fmt.Errorf("%w: %w", errReplicatedNotCopied, err))
	l.recoverAfter(err)
	return err
}

// errReplicatedNotCopied is Done's error for proposals the Replica holds
// that this copy failed to store.
var errReplicatedNotCopied = errors.New("audit: the replicated log holds the change but this copy failed to store it")

// hasProposal says whether batch holds a proposal.
func hasProposal(batch []*appendReq) bool {
	for _, r := range batch {
		if r.prop != nil {
			return true
		}
	}
	return false
}

// settle ends the flights after the first one was refused. It waits for
// the others' answers: those up to the last one stored are stored (that
// commit carried them), and the rest committed again one at a time, as
// the single-commit writer does: after catching up with another writer,
// or without the appends whose condition failed. A commit again at the
// same place is not a duplicate: the Replica answers that it holds it
// already if an answer was lost.
func (l *Log) settle(inflight []*flight) {
	last := -1
	for i, f := range inflight {
		if f.take(true); f.err == nil {
			last = i
		}
	}
	for i, f := range inflight {
		if i > last && len(f.p.props) > 0 {
			// Prepared on a tree the Replica no longer has (another
			// writer, or a fence that failed): refused, not prepared
			// again.
			err := fmt.Errorf("%w: commit of %d entries at index %d: %w", ErrUnavailable, len(f.p.batch), f.p.start, f.err)
			answer(f.p.batch, err)
			finish(f.p.props, err)
			continue
		}
		if i > last {
			l.commit(f.p.batch)
			continue
		}
		if l.store(f.p) != nil {
			for _, g := range inflight[i+1:] {
				answer(g.p.batch, errBehind(g.p))
				finish(g.p.props, errBehind(g.p))
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
