package etcdlog_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

const origin = "nvmegate.test/audit"

func signer(t testing.TB) *attest.LocalSigner {
	seed := sha256.Sum256([]byte("etcdlog-test"))
	s, err := attest.NewLocalSigner(ed25519.NewKeyFromSeed(seed[:]), 1)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// replica opens a gateway replica's copy of the log replicated in etcd.
func replica(t testing.TB, cl *clientv3.Client, dir string) *audit.Log {
	t.Helper()
	l, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: origin, Signer: signer(t),
		Replica: etcdlog.New(cl, "/nvmegate/audit/")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func entry(i int) audit.Entry {
	return audit.Entry{Kind: audit.EventGrant, JobID: fmt.Sprintf("job-%d", i%7), Tenant: "acme",
		Caller: "spiffe://nvmegate.test/node/gpu-1", GrantID: fmt.Sprintf("grant-%d", i),
		Time: time.Date(2026, 12, 5, 9, 0, 0, i, time.UTC)}
}

type acked struct {
	index uint64
	leaf  [32]byte
}

// Two replicas append at once to one log: every acknowledged entry is in
// both copies at the index it was acknowledged at, the copies agree on
// the tree, and a checkpoint one signs verifies on the other and offline.
func TestReplicasShareOneLog(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	a, b := replica(t, cl, t.TempDir()), replica(t, cl, t.TempDir())
	ctx := context.Background()

	var (
		mu   sync.Mutex
		acks []acked
		wg   sync.WaitGroup
	)
	for w := range 8 {
		l := a
		if w%2 == 1 {
			l = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				idx, leaf, err := l.Append(ctx, entry(w*1000+i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acks = append(acks, acked{idx, leaf})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, l := range []*audit.Log{a, b} {
		if err := l.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if a.Size() != 320 || b.Size() != 320 {
		t.Fatalf("copies of %d and %d entries, want 320", a.Size(), b.Size())
	}
	seen := map[uint64]bool{}
	for _, k := range acks {
		if seen[k.index] {
			t.Fatalf("index %d acknowledged twice", k.index)
		}
		seen[k.index] = true
		for _, l := range []*audit.Log{a, b} {
			if h, err := l.LeafHashAt(k.index); err != nil || h != k.leaf {
				t.Fatalf("index %d: %x, %v; acknowledged %x", k.index, h[:4], err, k.leaf[:4])
			}
		}
	}
	ra, _ := a.RootAt(ctx, 320)
	rb, _ := b.RootAt(ctx, 320)
	if ra != rb {
		t.Fatal("the copies disagree on the root")
	}

	// A checkpoint signed by a reaches b, which checks it against its own
	// tree; b's export verifies offline under the log's key.
	cp, err := a.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := b.LatestCheckpoint()
	if err != nil || got.Size != cp.Size || got.Hash != cp.Hash {
		t.Fatalf("b's latest checkpoint %d %v, a signed %d", got.Size, err, cp.Size)
	}
	dir := filepath.Join(t.TempDir(), "export")
	if _, err := b.Export(ctx, dir, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(ctx, dir, []attest.PublicKey{signer(t).PublicKey()}, nil, nil)
	if err != nil || len(rep.Failures) != 0 || rep.Entries != 320 {
		t.Fatalf("offline verification of b's export: %+v %v", rep, err)
	}
}

// A replica that starts empty (a new machine, or one whose disk was
// lost) fills its copy from etcd at Open: no acknowledged entry is lost
// with a replica's machine.
func TestNewReplicaCatchesUp(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	a := replica(t, cl, t.TempDir())
	ctx := context.Background()
	var last acked
	for i := range 50 {
		idx, leaf, err := a.Append(ctx, entry(i))
		if err != nil {
			t.Fatal(err)
		}
		last = acked{idx, leaf}
	}
	if _, err := a.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	a.Close() // the machine is gone
	n := replica(t, cl, t.TempDir())
	if n.Size() != 50 {
		t.Fatalf("the new copy holds %d entries, want 50", n.Size())
	}
	if h, err := n.LeafHashAt(last.index); err != nil || h != last.leaf {
		t.Fatal("the last acknowledged entry is not in the new copy")
	}
	if cp, err := n.LatestCheckpoint(); err != nil || cp.Size != 50 {
		t.Fatalf("the new copy's checkpoint: %d %v", cp.Size, err)
	}
	if _, _, err := n.Append(ctx, entry(99)); err != nil {
		t.Fatal(err)
	}
	if n.Size() != 51 {
		t.Fatalf("size %d after an append on the new copy", n.Size())
	}
}

// A writer that extends a head that is no longer the log's (a paused
// former leader, a replica behind) stores nothing.
func TestStaleWriterIsFenced(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	a := replica(t, cl, t.TempDir())
	ctx := context.Background()
	if _, _, err := a.Append(ctx, entry(1)); err != nil {
		t.Fatal(err)
	}
	r := etcdlog.New(cl, "/nvmegate/audit/")
	stale := audit.Commit{Start: 0, End: 1, Records: []byte{0, 1, 'x'}} // a second first commit
	if err := r.Append(ctx, stale); !errors.Is(err, audit.ErrConflict) {
		t.Fatalf("a commit on the empty tree after one was made: %v", err)
	}
	behind := audit.Commit{Start: 1, End: 2, PrevRoot: [32]byte{1}, Records: []byte{0, 1, 'x'}}
	if err := r.Append(ctx, behind); !errors.Is(err, audit.ErrConflict) {
		t.Fatalf("a commit on another root: %v", err)
	}
	var n int
	if err := r.Commits(ctx, 0, func(c audit.Commit) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("%d commits stored (%v), want 1", n, err)
	}
}

// A commit in etcd whose entries do not hash to the root stored with it
// (someone with write access to etcd edited it) is refused by a copy
// catching up, which stores none of it.
func TestTamperedCommitRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	a := replica(t, cl, t.TempDir())
	ctx := context.Background()
	for i := range 3 {
		if _, _, err := a.Append(ctx, entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := cl.Get(ctx, "/nvmegate/audit/c/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatal(err)
	}
	kv := resp.Kvs[len(resp.Kvs)-1]
	v := append([]byte(nil), kv.Value...)
	v[len(v)-3] ^= 'a' ^ 'b' // a letter of the last entry
	if _, err := cl.Put(ctx, string(kv.Key), string(v)); err != nil {
		t.Fatal(err)
	}
	_, err = audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: origin,
		Replica: etcdlog.New(cl, "/nvmegate/audit/")})
	if !errors.Is(err, audit.ErrCorrupt) {
		t.Fatalf("a copy from a tampered commit opened: %v", err)
	}
}

// A replica's copy torn by a crash (written without fsync) is set aside
// and filled again from etcd at Open: nothing acknowledged is lost.
func TestTornCopyRefilled(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.db")
	open := func() *audit.Log {
		l, err := audit.Open(path, audit.Options{Origin: origin, Replica: etcdlog.New(cl, "/a/")})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := open()
	ctx := context.Background()
	for i := range 30 {
		if _, _, err := l.Append(ctx, entry(i)); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := l.RootAt(ctx, 30)
	l.Close()
	// Tear the file: zero its meta pages.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l = open()
	defer l.Close()
	if got, _ := l.RootAt(ctx, 30); l.Size() != 30 || got != want {
		t.Fatalf("refilled copy: %d entries", l.Size())
	}
	if aside, _ := filepath.Glob(path + ".damaged-*"); len(aside) != 1 {
		t.Fatalf("the torn copy was not set aside: %v", aside)
	}
}
