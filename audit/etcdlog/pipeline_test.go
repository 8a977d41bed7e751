package etcdlog_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

// commits are n chained commits of one record each, with made-up roots
// (etcdlog stores what it is given; the copies check the hashes).
func commits(n int) []audit.Commit {
	out := make([]audit.Commit, n)
	var prev [32]byte
	for i := range out {
		root := [32]byte{byte(i + 1)}
		out[i] = audit.Commit{Start: uint64(i), End: uint64(i + 1), PrevRoot: prev, Root: root, Records: []byte{0, 1, byte('a' + i)}}
		prev = root
	}
	return out
}

func stored(t *testing.T, r *etcdlog.Log) []audit.Commit {
	t.Helper()
	var out []audit.Commit
	if err := r.Commits(context.Background(), 0, func(c audit.Commit) error { out = append(out, c); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// A commit that reaches etcd before the one it is chained on stores both;
// the overtaken one is then answered as stored, and only it: another
// commit at its place is a conflict.
func TestOvertakingCommitStoresPending(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	r := etcdlog.New(cl, "/p/")
	ctx := context.Background()
	cs := commits(3)
	second := cs[1]
	second.Pending = []audit.Commit{cs[0]}
	if err := r.Append(ctx, second); err != nil {
		t.Fatalf("the second commit, first to arrive: %v", err)
	}
	if err := r.Append(ctx, cs[0]); err != nil {
		t.Fatalf("the first commit, stored by the second: %v", err)
	}
	if err := r.Append(ctx, second); err != nil {
		t.Fatalf("the second again (a lost answer): %v", err)
	}
	other := cs[0]
	other.Root = [32]byte{9}
	err := r.Append(ctx, other)
	var conflict *audit.Conflict
	if !errors.As(err, &conflict) {
		t.Fatalf("another commit at 0: %v", err)
	}
	// The conflict carries what the writer missed, read in the same
	// round trip.
	if len(conflict.Commits) != 2 || conflict.Commits[0].Start != 0 || conflict.Commits[1].Start != 1 ||
		conflict.Commits[0].Root != cs[0].Root || conflict.Commits[1].Root != cs[1].Root {
		t.Fatalf("the conflict carries %+v", conflict.Commits)
	}
	// A chain whose first commit does not lead to the next is refused
	// before it reaches etcd.
	broken := cs[2]
	broken.Pending = []audit.Commit{cs[0]}
	if err := r.Append(ctx, broken); err == nil || errors.Is(err, audit.ErrConflict) {
		t.Fatalf("a chain with a gap: %v", err)
	}
	got := stored(t, r)
	if len(got) != 2 || got[0].Root != cs[0].Root || got[1].Root != cs[1].Root {
		t.Fatalf("stored %+v", got)
	}
}

// A commit carrying a pending one whose condition fails (a fenced
// former leader's) stores neither, and says it was fenced.
func TestPendingConditionFences(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	r := etcdlog.New(cl, "/p/")
	ctx := context.Background()
	cs := commits(2)
	cs[0].Conditions = []any{clientv3.Compare(clientv3.Version("/leader"), ">", 0)} // no leader key: false
	second := cs[1]
	second.Pending = []audit.Commit{cs[0]}
	if err := r.Append(ctx, second); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("a chain under a failed condition: %v", err)
	}
	if err := r.Append(ctx, cs[0]); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("the fenced commit itself: %v", err)
	}
	if got := stored(t, r); len(got) != 0 {
		t.Fatalf("stored %d commits under a failed condition", len(got))
	}
}

// scripted is a Replica whose first commit waits until the second is
// answered: the second overtakes it. Optionally the second's answer is
// lost after it was stored.
type scripted struct {
	audit.Replica
	n            atomic.Int32
	held, passed chan struct{}
	pending      atomic.Int32 // pending commits the second carried
	loseSecond   bool
}

func newScripted(r audit.Replica) *scripted {
	return &scripted{Replica: r, held: make(chan struct{}), passed: make(chan struct{})}
}

func (s *scripted) Append(ctx context.Context, c audit.Commit) error {
	switch s.n.Add(1) {
	case 1:
		close(s.held)
		select {
		case <-s.passed:
		case <-ctx.Done():
			return ctx.Err()
		}
		return s.Replica.Append(ctx, c)
	case 2:
		s.pending.Store(int32(len(c.Pending)))
		defer close(s.passed)
		err := s.Replica.Append(ctx, c)
		if s.loseSecond && err == nil {
			return context.DeadlineExceeded // stored, but the answer is lost
		}
		return err
	}
	return s.Replica.Append(ctx, c)
}

type result struct {
	index uint64
	err   error
}

// overtake appends a, waits until its commit is held, then appends b.
func overtake(t *testing.T, l *audit.Log, s *scripted, a, b context.Context) (ra, rb result) {
	t.Helper()
	ca, cb := make(chan result, 1), make(chan result, 1)
	go func() { i, _, err := l.Append(a, entry(1)); ca <- result{i, err} }()
	<-s.held
	go func() { i, _, err := l.Append(b, entry(2)); cb <- result{i, err} }()
	return <-ca, <-cb
}

// openOn opens a copy whose writer keeps two commits in flight.
func openOn(t *testing.T, r audit.Replica) *audit.Log {
	t.Helper()
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin, Replica: r, ReplicaInFlight: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// The log keeps two commits in etcd at once; when the second reaches etcd
// first, both appends are acknowledged at the indexes of their order, and
// a new copy filled from etcd has the same tree.
func TestPipelinedCommitsOvertake(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	s := newScripted(etcdlog.New(cl, "/a/"))
	l := openOn(t, s)
	ctx := context.Background()
	ra, rb := overtake(t, l, s, ctx, ctx)
	if ra.err != nil || rb.err != nil || ra.index != 0 || rb.index != 1 {
		t.Fatalf("appends: %+v %+v", ra, rb)
	}
	if s.pending.Load() != 1 {
		t.Fatalf("the second commit carried %d pending, want 1", s.pending.Load())
	}
	root, _ := l.RootAt(ctx, 2)
	n := openOn(t, etcdlog.New(cl, "/a/"))
	if got, _ := n.RootAt(ctx, 2); n.Size() != 2 || got != root {
		t.Fatalf("a new copy: %d entries", n.Size())
	}
}

// A commit whose answer is lost is committed again at its place, found
// stored, and not written twice.
func TestLostAnswerNotDuplicated(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	s := newScripted(etcdlog.New(cl, "/a/"))
	s.loseSecond = true
	l := openOn(t, s)
	ctx := context.Background()
	ra, rb := overtake(t, l, s, ctx, ctx)
	if ra.err != nil || rb.err != nil || ra.index != 0 || rb.index != 1 {
		t.Fatalf("appends: %+v %+v", ra, rb)
	}
	if i, _, err := l.Append(ctx, entry(3)); err != nil || i != 2 {
		t.Fatalf("the next append: %d %v", i, err)
	}
	if n := s.n.Load(); n != 4 {
		t.Fatalf("%d calls to the replica, want 4 (the second committed again)", n)
	}
	if got := stored(t, etcdlog.New(cl, "/a/")); len(got) != 3 || got[len(got)-1].End != 3 {
		t.Fatalf("etcd holds %d commits, want 3 of one entry each", len(got))
	}
}

// The first of two commits in flight is fenced (its appender was a
// leader that lost its term): the second, carrying it, is refused with
// it, and is then committed alone; the fenced append is refused.
func TestPipelinedFencedCommit(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	s := newScripted(etcdlog.New(cl, "/a/"))
	l := openOn(t, s)
	ctx := context.Background()
	fenced := audit.WithCondition(ctx, clientv3.Compare(clientv3.Version("/leader"), ">", 0))
	ra, rb := overtake(t, l, s, fenced, ctx)
	if !errors.Is(ra.err, audit.ErrFenced) {
		t.Fatalf("the fenced append: %+v", ra)
	}
	if rb.err != nil || rb.index != 0 || l.Size() != 1 {
		t.Fatalf("the unconditional append: %+v, size %d", rb, l.Size())
	}
}

// Another replica commits while this one's two commits are in flight:
// both are refused, caught up on and committed after it.
func TestPipelinedConflict(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	s := newScripted(etcdlog.New(cl, "/a/"))
	l := openOn(t, s)
	other := openOn(t, etcdlog.New(cl, "/a/"))
	ctx := context.Background()
	ca, cb := make(chan result, 1), make(chan result, 1)
	go func() { i, _, err := l.Append(ctx, entry(1)); ca <- result{i, err} }()
	<-s.held
	if i, _, err := other.Append(ctx, entry(9)); err != nil || i != 0 {
		t.Fatalf("the other replica's append: %d %v", i, err)
	}
	go func() { i, _, err := l.Append(ctx, entry(2)); cb <- result{i, err} }()
	ra, rb := <-ca, <-cb
	if ra.err != nil || rb.err != nil || ra.index != 1 || rb.index != 2 {
		t.Fatalf("appends after the other's: %+v %+v", ra, rb)
	}
	if err := other.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	r1, _ := l.RootAt(ctx, 3)
	r2, _ := other.RootAt(ctx, 3)
	if r1 != r2 || other.Size() != 3 {
		t.Fatal("the copies disagree")
	}
}

// gated is a Replica whose first commit waits until release is closed.
type gated struct {
	audit.Replica
	n             atomic.Int32
	held, release chan struct{}
}

func (g *gated) Append(ctx context.Context, c audit.Commit) error {
	if g.n.Add(1) == 1 {
		close(g.held)
		<-g.release
	}
	return g.Replica.Append(ctx, c)
}

// A Sync called while a commit is in flight, with appends still coming,
// answers once the flights have landed, and a copy behind another
// replica's commits catches up through it.
func TestSyncWithCommitsInFlight(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	g := &gated{Replica: etcdlog.New(cl, "/a/"), held: make(chan struct{}), release: make(chan struct{})}
	l := openOn(t, g)
	other := openOn(t, etcdlog.New(cl, "/a/"))
	ctx := context.Background()
	ca, cb := make(chan result, 1), make(chan result, 1)
	go func() { i, _, err := l.Append(ctx, entry(1)); ca <- result{i, err} }()
	<-g.held
	synced := make(chan error, 1)
	go func() { synced <- l.Sync(ctx) }()
	go func() { i, _, err := l.Append(ctx, entry(2)); cb <- result{i, err} }()
	close(g.release)
	ra, rb := <-ca, <-cb
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if ra.err != nil || rb.err != nil || ra.index != 0 || rb.index != 1 {
		t.Fatalf("appends around a Sync: %+v %+v", ra, rb)
	}
	if i, _, err := other.Append(ctx, entry(3)); err != nil || i != 2 {
		t.Fatalf("the other replica: %d %v", i, err)
	}
	if err := l.Sync(ctx); err != nil || l.Size() != 3 {
		t.Fatalf("after the other's append: size %d, %v", l.Size(), err)
	}
}

// Follow brings a copy another replica's commits and checkpoints as they
// are made, the copy skipping the heads it holds already.
func TestFollowBringsCommitsAndCheckpoints(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	r := etcdlog.New(cl, "/nvmegate/audit/")
	a, f := replica(t, cl, t.TempDir()), replica(t, cl, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Follow(ctx, cl, func(ctx context.Context, size uint64) error {
		if size > 0 && f.Size() >= size {
			return nil
		}
		return f.Sync(ctx)
	})
	if _, _, err := f.Append(ctx, entry(0)); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if _, _, err := a.Append(ctx, entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := a.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err := f.LatestCheckpoint()
		if f.Size() == 4 && err == nil && got.Size == cp.Size {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower holds %d entries and checkpoint %d (%v); want 4 and %d", f.Size(), got.Size, err, cp.Size)
		}
	}
}
