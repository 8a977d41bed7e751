package audit

import (
	"testing"
	"time"
)

// gatherLog is a Log with only what gather reads: its queue, its limits
// and its waits.
func gatherLog(wait, gap time.Duration, maxBatch int) *Log {
	return &Log{
		opts:     Options{GroupWait: wait},
		reqs:     make(chan *appendReq, 16),
		maxBatch: maxBatch,
		gap:      gap,
	}
}

func reqsOf(n int) []*appendReq {
	rs := make([]*appendReq, n)
	for i := range rs {
		rs[i] = &appendReq{data: []byte{byte(i)}}
	}
	return rs
}

// An append that arrives while a commit short of the last round waits is
// in that commit; the wait ends as soon as the round is reached.
func TestGatherTakesArrivalsUpToTheRound(t *testing.T) {
	l := gatherLog(time.Hour, time.Hour, 100)
	first := reqsOf(1)
	got := make(chan []*appendReq, 1)
	go func() { got <- l.gather(first, 3) }()
	late := reqsOf(3)
	for _, r := range late {
		l.reqs <- r
	}
	batch := <-got
	if len(batch) != 3 || batch[0] != first[0] || batch[1] != late[0] || batch[2] != late[1] {
		t.Fatalf("gather took %d appends, want the first and the two that came next (the round of 3)", len(batch))
	}
	if n := len(l.reqs); n != 1 {
		t.Fatalf("%d appends left queued, want 1: gather takes no more than the round", n)
	}
}

// With no append coming, the commit goes after the gap, unchanged.
func TestGatherEndsWhenNoneComes(t *testing.T) {
	l := gatherLog(time.Hour, time.Millisecond, 100)
	if batch := l.gather(reqsOf(1), 8); len(batch) != 1 {
		t.Fatalf("gather returned %d appends, want the 1 it was given", len(batch))
	}
}

// The whole wait is bounded by GroupWait, however often appends come.
func TestGatherBoundedByGroupWait(t *testing.T) {
	l := gatherLog(time.Millisecond, time.Hour, 1000)
	stop := make(chan struct{})
	defer close(stop)
	go func() { // an append every 100µs, more than the round
		for {
			select {
			case l.reqs <- &appendReq{}:
				time.Sleep(100 * time.Microsecond)
			case <-stop:
				return
			}
		}
	}()
	if batch := l.gather(reqsOf(1), 1000); len(batch) >= 1000 {
		t.Fatalf("gather took %d appends: it waited for the round past GroupWait", len(batch))
	}
}

// A negative GroupWait, a batch at the round, or one at the batch limit
// is sent as it is, leaving queued appends for the next commit.
func TestGatherDoesNotWait(t *testing.T) {
	for _, tc := range []struct {
		name            string
		wait            time.Duration
		batch, round, m int
	}{
		{"negative GroupWait", -1, 1, 8, 100},
		{"batch at the round", time.Hour, 3, 3, 100},
		{"batch at MaxBatch", time.Hour, 2, 8, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := gatherLog(tc.wait, time.Hour, tc.m)
			for _, r := range reqsOf(4) {
				l.reqs <- r
			}
			if batch := l.gather(reqsOf(tc.batch), tc.round); len(batch) != tc.batch {
				t.Fatalf("gather returned %d appends, want the %d it was given", len(batch), tc.batch)
			}
			if n := len(l.reqs); n != 4 {
				t.Fatalf("%d appends left queued, want 4", n)
			}
		})
	}
}
