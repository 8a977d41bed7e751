package etcdlog_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

// change is a proposal whose payload names it; it remembers how it ended.
type change struct {
	rev     uint64
	payload string

	mu    sync.Mutex
	first uint64
	done  []error
}

func (c *change) Prepare(first uint64) (audit.Prepared, error) {
	c.mu.Lock()
	c.first = first
	c.mu.Unlock()
	return audit.Prepared{Entries: []audit.Entry{{Kind: audit.EventStateChange, Detail: c.payload}},
		Revision: c.rev, Payload: []byte(c.payload)}, nil
}

func (c *change) Done(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = append(c.done, err)
}

func (c *change) ended() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.done...)
}

// fence is a term's condition in these tests: a key that must still be
// at the revision it was created at.
func fence(t *testing.T, cl *clientv3.Client, key string) (context.Context, func()) {
	t.Helper()
	resp, err := cl.Put(context.Background(), key, "leader")
	if err != nil {
		t.Fatal(err)
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision)
	return audit.WithCondition(context.Background(), cmp), func() {
		if _, err := cl.Delete(context.Background(), key); err != nil {
			t.Fatal(err)
		}
	}
}

// The leader's proposals reach every copy with their payloads: a follower
// that catches up holds each change beside the entry that records it, and
// hears of it (ChangesNotify).
func TestProposalsReplicateWithPayloads(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	leader, follower := replica(t, cl, t.TempDir()), replica(t, cl, t.TempDir())
	ctx, _ := fence(t, cl, "/term")
	if _, _, err := leader.Append(ctx, entry(0)); err != nil {
		t.Fatal(err)
	}
	var props []*change
	for i := range 20 {
		p := &change{rev: uint64(i + 1), payload: "change " + string(rune('a'+i))}
		props = append(props, p)
	}
	// In order: each proposal's revision follows the one before.
	for _, p := range props {
		first, err := leader.Propose(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if first != p.first {
			t.Fatalf("proposal answered at %d, prepared at %d", first, p.first)
		}
	}
	select {
	case <-leader.ChangesNotify():
	default:
		t.Fatal("the leader's copy stored changes and did not signal it")
	}
	if err := follower.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-follower.ChangesNotify():
	default:
		t.Fatal("the follower's copy stored changes and did not signal it")
	}
	for _, l := range []*audit.Log{leader, follower} {
		var got []string
		err := l.Changes(context.Background(), 0, func(rev, index uint64, payload []byte) error {
			p := props[rev-1]
			if index != p.first {
				t.Errorf("change %d recorded by entry %d, prepared at %d", rev, index, p.first)
			}
			got = append(got, string(payload))
			return nil
		})
		if err != nil || len(got) != len(props) {
			t.Fatalf("%d changes (%v), want %d", len(got), err, len(props))
		}
		for i, g := range got {
			if g != props[i].payload {
				t.Fatalf("change %d is %q, want %q", i+1, g, props[i].payload)
			}
		}
	}
	for _, p := range props {
		if d := p.ended(); len(d) != 1 || d[0] != nil {
			t.Fatalf("proposal %d ended %v, want one success", p.rev, d)
		}
	}
}

// Only a fenced proposer sequences on a replicated log, and a proposal
// whose fence failed (a former leader) is refused, undone, and stores
// nothing.
func TestProposalNeedsLiveFence(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	l := replica(t, cl, t.TempDir())
	if _, err := l.Propose(context.Background(), &change{rev: 1, payload: "x"}); !errors.Is(err, audit.ErrNoProposals) {
		t.Fatalf("a proposal without a fence: %v", err)
	}
	ctx, lose := fence(t, cl, "/term")
	lose()
	p := &change{rev: 1, payload: "after the term"}
	if _, err := l.Propose(ctx, p); !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("a proposal under a lost fence: %v", err)
	}
	if d := p.ended(); len(d) != 1 || d[0] == nil {
		t.Fatalf("the fenced proposal ended %v, want one failure", d)
	}
	if l.Size() != 0 {
		t.Fatalf("the copy holds %d entries after a fenced proposal", l.Size())
	}
	if last, err := l.LastChange(); err != nil || last != 0 {
		t.Fatalf("last change %d (%v) after a fenced proposal", last, err)
	}
}

// A proposal prepared on a tree another writer moved (a failover: the
// old leader's copy is behind) is refused and undone, not prepared again
// on the new tree: its rules ran on a state that is not the log's.
func TestProposalOnMovedTreeRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	stale, other := replica(t, cl, t.TempDir()), replica(t, cl, t.TempDir())
	ctx, _ := fence(t, cl, "/term")
	if _, _, err := other.Append(context.Background(), entry(1)); err != nil {
		t.Fatal(err)
	}
	p := &change{rev: 1, payload: "on an old tree"}
	if _, err := stale.Propose(ctx, p); !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("a proposal on a moved tree: %v", err)
	}
	if d := p.ended(); len(d) != 1 || d[0] == nil {
		t.Fatalf("the refused proposal ended %v, want one failure", d)
	}
	if err := stale.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if last, err := stale.LastChange(); err != nil || last != 0 || stale.Size() != 1 {
		t.Fatalf("after catching up: last change %d (%v), %d entries; want none and 1", last, err, stale.Size())
	}
	// Caught up, it sequences again.
	p2 := &change{rev: 1, payload: "on the tree"}
	ctx2, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if first, err := stale.Propose(ctx2, p2); err != nil || first != 1 {
		t.Fatalf("proposal after catching up: %d, %v", first, err)
	}
}

// A payload edited in etcd (someone with write access changed what a
// replayed change writes) is refused by a copy applying the commit: the
// tree's root covers the entries, and each entry commits to its payload.
func TestTamperedPayloadRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	leader := replica(t, cl, t.TempDir())
	ctx, _ := fence(t, cl, "/term")
	if _, err := leader.Propose(ctx, &change{rev: 1, payload: "grant g1 active"}); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Get(context.Background(), "/nvmegate/audit/c/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatal(err)
	}
	kv := resp.Kvs[len(resp.Kvs)-1]
	v := bytes.Replace(kv.Value, []byte("grant g1 active"), []byte("grant g1 ACTIVE"), 1)
	if bytes.Equal(v, kv.Value) {
		t.Fatal("the payload is not in the commit record")
	}
	if _, err := cl.Put(context.Background(), string(kv.Key), string(v)); err != nil {
		t.Fatal(err)
	}
	_, err = audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin,
		Replica: etcdlog.New(cl, "/nvmegate/audit/")})
	if !errors.Is(err, audit.ErrCorrupt) {
		t.Fatalf("a copy from a commit with an edited payload opened: %v", err)
	}
}

// heldReplica is a Replica whose commits with changes wait to be let through,
// one per release; it tells of each commit as it is sent.
type heldReplica struct {
	audit.Replica
	sent    chan audit.Commit
	release chan struct{}
}

func (g *heldReplica) Append(ctx context.Context, c audit.Commit) error {
	g.sent <- c
	if len(c.Changes) > 0 {
		<-g.release
	}
	return g.Replica.Append(ctx, c)
}

// step is a proposal that notes in a shared list when it is prepared
// (with the copy's size then) and when it is done.
type step struct {
	name   string
	rev    uint64
	l      **audit.Log
	events *events
	drain  bool
}

type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, s)
}

func (s *step) Prepare(first uint64) (audit.Prepared, error) {
	s.events.add(fmt.Sprintf("prepare %s at %d, copy at %d", s.name, first, (*s.l).Size()))
	return audit.Prepared{Entries: []audit.Entry{{Kind: audit.EventStateChange, Detail: s.name}},
		Revision: s.rev, Payload: []byte(s.name)}, nil
}

func (s *step) Done(err error) { s.events.add(fmt.Sprintf("done %s %v", s.name, err)) }

// drainingStep is a step that wants the copy drained first (audit.Drainer).
type drainingStep struct{ step }

func (s *drainingStep) DrainFirst() bool { return true }

// chainRun proposes a, waits until its commit is in the Replica, queues
// b behind it, lets a through, and returns what happened in order.
func chainRun(t *testing.T, b func(**audit.Log, *events) audit.Proposal) []string {
	t.Helper()
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	g := &heldReplica{Replica: etcdlog.New(cl, "/nvmegate/audit/"), sent: make(chan audit.Commit, 4), release: make(chan struct{}, 4)}
	var l *audit.Log
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin, Signer: signer(t), Replica: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, _ := fence(t, cl, "/term")
	ev := &events{}
	a := &step{name: "a", rev: 1, l: &l, events: ev}
	errs := make(chan error, 2)
	go func() { _, err := l.Propose(ctx, a); errs <- err }()
	<-g.sent // a is in the Replica, held there
	go func() { _, err := l.Propose(ctx, b(&l, ev)); errs <- err }()
	for l.Queued() == 0 {
		runtime.Gosched() // b waits behind a
	}
	g.release <- struct{}{}
	<-g.sent // b's commit
	g.release <- struct{}{}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if l.Size() != 2 {
		t.Fatalf("the copy holds %d entries, want 2", l.Size())
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	return ev.list
}

// Once the Replica holds a commit, the next one is prepared on it and
// sent before this copy stores the first: the Replica's round and the
// copy's commit overlap.
func TestNextCommitSentBeforeTheCopyStores(t *testing.T) {
	got := chainRun(t, func(l **audit.Log, ev *events) audit.Proposal {
		return &step{name: "b", rev: 2, l: l, events: ev}
	})
	want := []string{"prepare a at 0, copy at 0", "prepare b at 1, copy at 0", "done a <nil>", "done b <nil>"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// A proposal that wants the changes before it durable first (a store
// whose checkpoint is due) is prepared only once this copy stored them.
func TestDrainerPreparedAfterTheCopyStores(t *testing.T) {
	got := chainRun(t, func(l **audit.Log, ev *events) audit.Proposal {
		return &drainingStep{step{name: "b", rev: 2, l: l, events: ev}}
	})
	want := []string{"prepare a at 0, copy at 0", "done a <nil>", "prepare b at 1, copy at 1", "done b <nil>"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// big is a proposal with a large payload.
type big struct {
	rev  uint64
	size int
}

func (b big) Prepare(uint64) (audit.Prepared, error) {
	return audit.Prepared{Entries: []audit.Entry{{Kind: audit.EventStateChange, Detail: fmt.Sprint("change ", b.rev)}},
		Revision: b.rev, Payload: bytes.Repeat([]byte{byte(b.rev)}, b.size)}, nil
}

func (big) Done(error) {}

// Proposals queued together whose payloads exceed etcd's request limit
// are sequenced in consecutive commits, each within the limit: gather
// bounds a batch's entries, and only the prepared proposals know their
// payloads. (Found by a storm through three replicas: a commit of 620
// connects was refused whole, "request is too large".)
func TestOversizedBatchSentInParts(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	g := &heldReplica{Replica: etcdlog.New(cl, "/nvmegate/audit/"), sent: make(chan audit.Commit, 64), release: make(chan struct{}, 64)}
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin, Signer: signer(t), Replica: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx, _ := fence(t, cl, "/term")
	const n, size = 40, 64 << 10 // 2.5 MiB of payloads in all
	errs := make(chan error, n+1)
	go func() { _, err := l.Propose(ctx, big{rev: 1, size: 10}); errs <- err }()
	<-g.sent // held in the Replica while the others queue behind it
	for i := range n {
		go func() { _, err := l.Propose(ctx, big{rev: uint64(i + 2), size: size}); errs <- err }()
		for l.Queued() < i+1 {
			runtime.Gosched() // in revision order
		}
	}
	for range n + 1 {
		g.release <- struct{}{}
	}
	for range n + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	commits := 1
	for len(g.sent) > 0 {
		cm := <-g.sent
		commits++
		bytes := len(cm.Records)
		for _, ch := range cm.Changes {
			bytes += len(ch.Payload)
		}
		if bytes > 1<<20 {
			t.Errorf("a commit of %d bytes: past the request limit", bytes)
		}
	}
	if commits < 4 {
		t.Errorf("%d commits for 2.5 MiB of payloads, want at least 4 (1 + the parts)", commits)
	}
	if l.Size() != n+1 {
		t.Fatalf("the copy holds %d entries, want %d", l.Size(), n+1)
	}
}
