package etcdlog_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

// copyWith opens a replica's copy that fetches trimmed history from src.
func copyWith(t *testing.T, cl *clientv3.Client, src audit.HistorySource) (*audit.Log, error) {
	t.Helper()
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin, Signer: signer(t),
		Replica: etcdlog.New(cl, "/nvmegate/audit/"), History: src})
	if err == nil {
		t.Cleanup(func() { l.Close() })
	}
	return l, err
}

// fill makes n commits on l, every third a proposal (a change with its
// payload), under ctx's fence.
func fill(t *testing.T, ctx context.Context, l *audit.Log, n int, rev *uint64) {
	t.Helper()
	for i := range n {
		if i%3 == 0 {
			*rev++
			if _, err := l.Propose(ctx, &change{rev: *rev, payload: "change " + string(rune('a'+*rev%26))}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if _, _, err := l.Append(ctx, entry(i)); err != nil {
			t.Fatal(err)
		}
	}
}

func changesOf(t *testing.T, l *audit.Log) []string {
	t.Helper()
	var out []string
	err := l.Changes(context.Background(), 0, func(rev, index uint64, payload []byte) error {
		out = append(out, string(payload))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The leader trims what the copies hold: etcd then holds the tail only, a
// new copy fills the history from another copy (changes included) and
// agrees on the tree, and one with no other copy is told why it cannot.
func TestTrimKeepsTheTailAndCopiesFillTheHistory(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	ctx, _ := fence(t, cl, "/term")
	leader := replica(t, cl, t.TempDir())
	var rev uint64
	fill(t, ctx, leader, 60, &rev)
	if _, err := leader.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	fill(t, ctx, leader, 30, &rev)
	if _, err := leader.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	el := etcdlog.New(cl, "/nvmegate/audit/")
	start, trimRev, err := el.Trim(ctx, 50)
	if err != nil || start == 0 || start > 50 || trimRev == 0 {
		t.Fatalf("trim to 50: start %d, revision %d, %v", start, trimRev, err)
	}
	if err := el.Compact(ctx, trimRev); err != nil {
		t.Fatal(err)
	}
	if err := el.Compact(ctx, trimRev); err != nil {
		t.Fatalf("compacting the same revision again: %v", err)
	}
	keys, err := cl.Get(context.Background(), "/nvmegate/audit/c/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range keys.Kvs {
		if string(kv.Key) < fmt.Sprintf("/nvmegate/audit/c/%016x", start) {
			t.Fatalf("commit %s before the tail's start %d is still in etcd", kv.Key, start)
		}
	}
	if err := el.Commits(context.Background(), 0, func(audit.Commit) error { return nil }); !errors.Is(err, audit.ErrTrimmed) {
		t.Fatalf("reading trimmed commits: %v, want ErrTrimmed", err)
	}
	if err := el.Commits(context.Background(), start, func(audit.Commit) error { return nil }); err != nil {
		t.Fatal(err)
	}

	// A copy with no other copy to fetch from cannot start, and says why.
	if _, err := copyWith(t, cl, nil); !errors.Is(err, audit.ErrTrimmed) {
		t.Fatalf("a new copy without history: %v, want ErrTrimmed", err)
	}
	// With the leader's copy as its history it starts, and is the same log.
	fresh, err := copyWith(t, cl, leader)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Size() != leader.Size() {
		t.Fatalf("the new copy holds %d entries, the leader %d", fresh.Size(), leader.Size())
	}
	for _, size := range []uint64{1, start, leader.Size()} {
		a, _ := leader.RootAt(context.Background(), size)
		b, err := fresh.RootAt(context.Background(), size)
		if err != nil || a != b {
			t.Fatalf("root at %d: %x and %x (%v)", size, a[:4], b[:4], err)
		}
	}
	if got, want := changesOf(t, fresh), changesOf(t, leader); len(got) != len(want) || len(got) == 0 {
		t.Fatalf("the new copy holds %d changes, the leader %d", len(got), len(want))
	}
	// The leader goes on; the new copy follows the tail.
	fill(t, ctx, leader, 5, &rev)
	if err := fresh.Sync(context.Background()); err != nil || fresh.Size() != leader.Size() {
		t.Fatalf("after more commits: %d of %d entries (%v)", fresh.Size(), leader.Size(), err)
	}
}

// Another copy is not trusted: history from a different log of the same
// origin (each page consistent in itself) is refused, and nothing of it
// is stored.
func TestHistoryFromAnotherLogRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	ctx, _ := fence(t, cl, "/term")
	leader := replica(t, cl, t.TempDir())
	var rev uint64
	fill(t, ctx, leader, 40, &rev)
	start, _, err := etcdlog.New(cl, "/nvmegate/audit/").Trim(ctx, 30)
	if err != nil || start == 0 {
		t.Fatalf("trim: %d, %v", start, err)
	}
	// A log of the same origin and size, other entries.
	other, err := audit.Open(filepath.Join(t.TempDir(), "other.db"), audit.Options{Origin: origin, Signer: signer(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for i := range int(leader.Size()) {
		e := entry(i)
		e.Detail = "forged"
		if _, _, err := other.Append(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.db")
	_, err = audit.Open(path, audit.Options{Origin: origin, Signer: signer(t),
		Replica: etcdlog.New(cl, "/nvmegate/audit/"), History: other})
	if !errors.Is(err, audit.ErrCorrupt) {
		t.Fatalf("history from another log: %v, want ErrCorrupt", err)
	}
	ro, err := audit.Open(path, audit.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ro.Size() != 0 {
		t.Fatalf("the refused history left %d entries in the copy", ro.Size())
	}
}

// A former leader's trim is refused (its fence failed): it deletes nothing.
func TestTrimFenced(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	ctx, lose := fence(t, cl, "/term")
	leader := replica(t, cl, t.TempDir())
	var rev uint64
	fill(t, ctx, leader, 20, &rev)
	lose()
	el := etcdlog.New(cl, "/nvmegate/audit/")
	if _, _, err := el.Trim(ctx, 15); !errors.Is(err, audit.ErrFenced) {
		t.Fatalf("a former leader's trim: %v, want ErrFenced", err)
	}
	if err := el.Commits(context.Background(), 0, func(audit.Commit) error { return nil }); err != nil {
		t.Fatalf("after a refused trim: %v", err)
	}
}

// A replica's reported size lives as long as its lease.
func TestPositionsLiveWithTheLease(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	el := etcdlog.New(cl, "/nvmegate/audit/")
	ctx := context.Background()
	lease, err := cl.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if err := el.Report(ctx, "gw-a", 42, lease.ID); err != nil {
		t.Fatal(err)
	}
	if err := el.Report(ctx, "gw-b", 7, clientv3.NoLease); err != nil {
		t.Fatal(err)
	}
	pos, err := el.Positions(ctx)
	if err != nil || pos["gw-a"] != 42 || pos["gw-b"] != 7 || len(pos) != 2 {
		t.Fatalf("positions %v (%v)", pos, err)
	}
	if _, err := cl.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if pos, err = el.Positions(ctx); err != nil || len(pos) != 1 || pos["gw-b"] != 7 {
		t.Fatalf("after gw-a's lease ended: %v (%v)", pos, err)
	}
}
