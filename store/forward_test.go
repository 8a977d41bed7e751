package store_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/storetest"
)

// cluster is replicas of one store, each projecting one audit log
// replicated on a real etcd; writes of a replica that does not lead go
// to the leader's Apply as bytes (what the internal gRPC call carries).
type cluster struct {
	t    *testing.T
	cl   *clientv3.Client
	pre  string
	logs []*audit.Log
	dbs  []*store.DB

	mu     sync.Mutex
	leader int // -1: none
}

// toLeader is a replica's Forwarder: the leader of the moment, in
// process.
type toLeader struct{ c *cluster }

func (f toLeader) Forward(ctx context.Context, req []byte) ([]byte, error) {
	f.c.mu.Lock()
	i := f.c.leader
	f.c.mu.Unlock()
	if i < 0 {
		return nil, store.ErrNotLeader
	}
	return f.c.dbs[i].Apply(ctx, req)
}

func logSigner(t testing.TB) *attest.LocalSigner {
	seed := sha256.Sum256([]byte("forward-test"))
	s, err := attest.NewLocalSigner(ed25519.NewKeyFromSeed(seed[:]), 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newCluster(t *testing.T, cl *clientv3.Client, prefix string, n int) *cluster {
	c := &cluster{t: t, cl: cl, pre: prefix, leader: -1}
	for range n {
		c.add()
	}
	return c
}

// add opens one more replica.
func (c *cluster) add() *store.DB { return c.openIn(c.t.TempDir()) }

// openIn opens a replica whose files are in dir.
func (c *cluster) openIn(dir string) *store.DB {
	t := c.t
	l, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/forward", Signer: logSigner(t),
		Replica: etcdlog.New(c.cl, c.pre+"audit/")})
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: l, Forward: toLeader{c}})
	if err != nil {
		t.Fatal(err)
	}
	follow(t, l, c.cl, c.pre+"audit/")
	t.Cleanup(func() { db.Close(); l.Close() })
	c.logs, c.dbs = append(c.logs, l), append(c.dbs, db)
	return db
}

// elect makes replica i the leader of a new term, fenced on a key of
// its own, and returns the end of the term.
func (c *cluster) elect(i int) context.CancelFunc {
	t := c.t
	key := fmt.Sprintf("%sterm/%d", c.pre, i)
	resp, err := c.cl.Put(context.Background(), key, "x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(audit.WithCondition(context.Background(),
		clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision)))
	if err := c.dbs[i].Lead(ctx); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.leader = i
	c.mu.Unlock()
	return func() {
		cancel()
		if _, err := c.cl.Delete(context.Background(), key); err != nil {
			t.Error(err)
		}
	}
}

// The conformance suite on three replicas that forward their writes to
// one leader: each write goes to one replica, reads to the others.
func TestForwardedConformance(t *testing.T) {
	e := etcdtest.Start(t, 1)
	cl := e.Client(t)
	n := 0
	storetest.Run(t, func(t *testing.T) []*store.DB {
		n++
		c := newCluster(t, cl, fmt.Sprintf("/fwd/%d/", n), 3)
		c.elect(0)
		return c.dbs
	})
}

var bg = context.Background()

// follow applies the leader's commits to l as etcd's watch delivers
// them, as a replica's daemon does, until the test ends.
func follow(t *testing.T, l *audit.Log, cl *clientv3.Client, prefix string) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = etcdlog.New(cl, prefix).FollowCommits(ctx, cl, l.Offer, func(ctx context.Context, _ uint64) error { return l.Sync(ctx) })
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func fwdTarget(id string) *nvmegate.Target {
	return &nvmegate.Target{ID: id, Fabric: "fab-a", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: nvmegate.TransportTCP, AddressFamily: nvmegate.FamilyIPv4,
			Address: "192.0.2.10", ServiceID: "4420"}}}
}

// digests checks that every replica, after catching up, has one state
// digest at one revision, and returns it.
func (c *cluster) digests() (uint64, string) {
	t := c.t
	t.Helper()
	var rev0 uint64
	var d0 string
	for i, db := range c.dbs {
		if err := db.Sync(bg); err != nil {
			t.Fatal(err)
		}
		rev, d, err := db.StateDigest(bg)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			rev0, d0 = rev, d
		} else if rev != rev0 || d != d0 {
			t.Fatalf("replica %d at revision %d digest %s; replica 0 at %d digest %s", i, rev, d, rev0, d0)
		}
	}
	return rev0, d0
}

// Followers' writes are sequenced by the leader alone: no commit of any
// replica loses a compare on the log's head, every replica reaches one
// state, and a replica that joins later replays it from the log alone.
func TestFollowersForwardNoLostCompares(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/nolost/", 3)
	c.elect(1)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				if err := c.dbs[w%3].CreateTarget(bg, fwdTarget(fmt.Sprintf("t-%d-%d", w, i))); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	rev, d := c.digests()
	if rev != 60 {
		t.Fatalf("revision %d after 60 writes", rev)
	}
	for i, l := range c.logs {
		if n := l.LostCompares(); n != 0 {
			t.Fatalf("replica %d lost %d compares on the log's head", i, n)
		}
	}
	late := c.add()
	if err := late.Sync(bg); err != nil {
		t.Fatal(err)
	}
	if r, d2, err := late.StateDigest(bg); err != nil || r != rev || d2 != d {
		t.Fatalf("a replica replayed from the log: revision %d digest %s (%v); want %d %s", r, d2, err, rev, d)
	}
}

// A forwarding store needs a journal to project.
func TestForwardNeedsJournal(t *testing.T) {
	if _, err := store.Open(filepath.Join(t.TempDir(), "x.db"), store.Options{Forward: toLeader{}}); err == nil {
		t.Fatal("a forwarding store without a journal opened")
	}
}

// A leader whose term ended refuses forwarded writes (ErrNotLeader) and
// forwards its own; a new leader sequences from where the log is, and
// every replica ends at one state.
func TestFailoverMovesTheSequencer(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/failover/", 3)
	end := c.elect(0)
	for i := range 5 {
		if err := c.dbs[i%3].CreateTarget(bg, fwdTarget(fmt.Sprintf("a%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	end()
	c.mu.Lock()
	c.leader = -1
	c.mu.Unlock()
	if err := c.dbs[0].CreateTarget(bg, fwdTarget("nobody")); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a write with no leader: %v", err)
	}
	if _, err := c.dbs[0].Apply(bg, []byte(`{"id":"x","op":"create_target","args":{}}`)); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a forwarded write on a former leader: %v", err)
	}
	c.elect(2)
	for i := range 5 {
		if err := c.dbs[i%3].CreateTarget(bg, fwdTarget(fmt.Sprintf("b%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if rev, _ := c.digests(); rev != 10 {
		t.Fatalf("revision %d after 10 writes across a failover", rev)
	}
}

// A former leader that has not noticed its term ended (paused past its
// lease) cannot sequence: its proposal fails on the fence, leaves no
// trace, and its copy then follows the new leader's changes.
func TestPausedLeaderFenced(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/paused/", 2)
	key := c.pre + "term/paused"
	resp, err := c.cl.Put(bg, key, "x")
	if err != nil {
		t.Fatal(err)
	}
	term := audit.WithCondition(bg, clientv3.Compare(clientv3.CreateRevision(key), "=", resp.Header.Revision))
	if err := c.dbs[0].Lead(term); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.leader = 0
	c.mu.Unlock()
	if err := c.dbs[1].CreateTarget(bg, fwdTarget("before")); err != nil {
		t.Fatal(err)
	}
	// The term's key is gone (its lease expired) and another leads; the
	// old leader's context is still alive.
	if _, err := c.cl.Delete(bg, key); err != nil {
		t.Fatal(err)
	}
	c.elect(1)
	if err := c.dbs[0].DeleteTarget(bg, "before"); !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("a write sequenced under a lost fence: %v", err)
	}
	if err := c.dbs[1].CreateTarget(bg, fwdTarget("after")); err != nil {
		t.Fatal(err)
	}
	rev, _ := c.digests()
	if rev != 2 {
		t.Fatalf("revision %d, want 2 (the fenced write left a trace?)", rev)
	}
	if _, err := c.dbs[0].Target(bg, "before"); err != nil {
		t.Fatalf("the fenced delete took effect on the former leader's copy: %v", err)
	}
}

// Replicas upgraded from a replicated store that was not a projection
// (their copies hold revisions no log records): the first leader records
// its state once as the genesis, a copy at that state goes on from it,
// and a new copy starts from it.
func TestUpgradeRecordsGenesis(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := &cluster{t: t, cl: e.Client(t), pre: "/upgrade/", leader: -1}
	// Two copies made before: the same three writes in each.
	var dirs []string
	for range 2 {
		dir := t.TempDir()
		at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC) // copies of one store: the same records
		old, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := old.CreateTarget(bg, fwdTarget(fmt.Sprintf("old%d", i))); err != nil {
				t.Fatal(err)
			}
		}
		old.Close()
		dirs = append(dirs, dir)
	}
	for _, dir := range dirs {
		c.openIn(dir)
	}
	c.elect(0)
	fresh := c.add()
	if err := c.dbs[1].CreateTarget(bg, fwdTarget("new")); err != nil {
		t.Fatal(err)
	}
	rev, _ := c.digests()
	if rev != 4 {
		t.Fatalf("revision %d after 3 writes before the upgrade and one after", rev)
	}
	if _, err := fresh.Target(bg, "old2"); err != nil {
		t.Fatalf("a new copy lacks the state from before the upgrade: %v", err)
	}
}

// A request retried through a new leader, after the one that applied it
// died before answering, is recognised from the log and not applied
// again: the caller learns its outcome is unknown (EUNAVAILABLE).
func TestRetryThroughNewLeaderNotAppliedTwice(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/retry2/", 2)
	end := c.elect(0)
	req := []byte(`{"op":"create_target","args":{"record":{"ID":"t-once","Fabric":"fab-a","Region":"eu-west","Driver":"nvmet","Ports":[{"ID":1,"Transport":"tcp","AddressFamily":"ipv4","Address":"192.0.2.10","ServiceID":"4420"}]}}}`)
	ctx := store.WithRequestID(bg, "req-0001")
	if _, err := c.dbs[0].Apply(ctx, req); err != nil {
		t.Fatal(err)
	}
	end()
	c.elect(1)
	before := c.dbs[1].Revision()
	_, err := c.dbs[1].Apply(ctx, req)
	if !errors.Is(err, store.ErrAppliedBefore) || nvmegate.ErrorCode(err) != nvmegate.EUNAVAILABLE {
		t.Fatalf("a retry through the next leader: %v", err)
	}
	if got := c.dbs[1].Revision(); got != before {
		t.Fatalf("revision %d after the retry, want %d", got, before)
	}
	// Another request is applied as ever.
	if _, err := c.dbs[1].Apply(store.WithRequestID(bg, "req-0002"), bytes.Replace(req, []byte("t-once"), []byte("t-twice"), 1)); err != nil {
		t.Fatal(err)
	}
}

// Retries of one request racing on the leader (a forwarder that retried
// while its first attempt was still in flight) make the write once: the
// ID is checked in the sequencer, with the changes in flight, not read
// before it.
func TestConcurrentRetriesAppliedOnce(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/retry3/", 1)
	c.elect(0)
	before := c.dbs[0].Revision()
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		// Each attempt names another target, so that only the
		// request's ID can tell them apart from new writes.
		req := fmt.Sprintf(`{"op":"create_target","args":{"record":{"ID":"t-race-%d","Fabric":"fab-a","Region":"eu-west","Driver":"nvmet","Ports":[{"ID":1,"Transport":"tcp","AddressFamily":"ipv4","Address":"192.0.2.10","ServiceID":"4420"}]}}}`, i)
		go func() { // each attempt its own call, as the peer service makes it
			_, err := c.dbs[0].Apply(store.WithRequestID(bg, "req-race"), []byte(req))
			errs <- err
		}()
	}
	made := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			made++
		case !errors.Is(err, store.ErrAppliedBefore):
			t.Fatalf("a racing retry: %v", err)
		}
	}
	if made != 1 {
		t.Fatalf("%d attempts of one request were made, want 1", made)
	}
	if got := c.dbs[0].Revision(); got != before+1 {
		t.Fatalf("revision %d after the retries, want %d", got, before+1)
	}
}

// A forwarded entry that claims a change is refused: only the sequencer
// records changes, and a claimed one would name a payload no copy holds.
func TestForwardedEntryClaimingChangeRefused(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/claim/", 1)
	c.elect(0)
	req := []byte(`{"op":"create_target","args":{"record":{"ID":"t-claim","Fabric":"fab-a","Region":"eu-west","Driver":"nvmet","Ports":[{"ID":1,"Transport":"tcp","AddressFamily":"ipv4","Address":"192.0.2.10","ServiceID":"4420"}]}},` +
		`"call":{"Kind":"inventory_change","Change":{"Digest":"sha256:00","Revision":9}}}`)
	if _, err := c.dbs[0].Apply(bg, req); nvmegate.ErrorCode(err) != nvmegate.EINVALID {
		t.Fatalf("a forwarded entry claiming a change: %v", err)
	}
	if c.dbs[0].Revision() != 0 {
		t.Fatal("the refused write was made")
	}
}

// The work of a term (a write under its fence) on a replica that no
// longer leads is refused, never forwarded to the new leader, where it
// would be made without a fence.
func TestFencedWriteNotForwarded(t *testing.T) {
	e := etcdtest.Start(t, 1)
	c := newCluster(t, e.Client(t), "/fenced/", 2)
	c.elect(0)
	old := audit.WithCondition(bg, clientv3.Compare(clientv3.CreateRevision(c.pre+"term/gone"), "=", 7))
	if err := c.dbs[1].CreateTarget(old, fwdTarget("t-sweep")); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a former term's write on a follower: %v", err)
	}
	if err := c.dbs[0].Sync(bg); err != nil {
		t.Fatal(err)
	}
	if c.dbs[0].Revision() != 0 {
		t.Fatal("the former term's write was made by the leader")
	}
}
