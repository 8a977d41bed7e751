package audit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

// mountTmpfs mounts a tmpfs of the given size (e.g. "1m") in a temp dir, or
// skips the test where mounting is not allowed (not root, no CAP_SYS_ADMIN).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); TestAppendFailsClosedMaxSize covers the failure path", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

func remount(t *testing.T, dir, opts string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+opts, dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s: %v: %s", opts, err, out)
	}
}

// fillUntilFailure appends until an append fails and returns the acked
// leaf hashes by index and the error.
func fillUntilFailure(t *testing.T, l *audit.Log, limit int) (map[uint64][32]byte, error) {
	t.Helper()
	acked := map[uint64][32]byte{}
	for i := 0; i < limit; i++ {
		idx, leaf, err := l.Append(context.Background(), sampleEntry(i))
		if err != nil {
			return acked, err
		}
		acked[idx] = leaf
	}
	t.Fatalf("no failure after %d appends", limit)
	return nil, nil
}

// checkAfterFailure checks that a log that refused appends is consistent:
// every acknowledged entry is there, more appends work once space is back,
// a checkpoint consistent with the last one is signed, and it verifies.
func checkAfterFailure(t *testing.T, l *audit.Log, path string, acked map[uint64][32]byte, s attest.Signer) {
	t.Helper()
	ctx := context.Background()
	for i, want := range acked {
		if got, err := l.LeafHashAt(i); err != nil || got != want {
			t.Fatalf("acknowledged entry %d: %x %v", i, got, err)
		}
	}
	before := l.Size()
	if _, _, err := l.Append(ctx, sampleEntry(424242)); err != nil {
		t.Fatalf("append after space came back: %v", err)
	}
	if l.Size() != before+1 {
		t.Fatalf("size %d after one append to %d", l.Size(), before)
	}
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatalf("checkpoint after failure: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := audit.CheckFile(ctx, path, []attest.PublicKey{s.PublicKey()}, nil, nil)
	if err != nil || !r.OK() {
		t.Fatalf("log after failure does not verify: %v %v", err, r.Failures)
	}
}

// TestAppendFailsClosedDiskFull fills a real (tmpfs) file system: the
// append that cannot be written returns ErrUnavailable, no acknowledged
// entry is lost, and the log works again once there is space.
func TestAppendFailsClosedDiskFull(t *testing.T) {
	dir := mountTmpfs(t, "2m")
	path := filepath.Join(dir, "audit.db")
	s := testSigner(t, "k", 1)
	l := openLog(t, path, s)
	ctx := context.Background()
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	acked, err := fillUntilFailure(t, l, 1_000_000)
	if !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("append on a full disk: %v", err)
	}
	t.Logf("disk full after %d appends: %v", len(acked), err)
	// Still full: still refused, nothing half-written is acknowledged.
	if _, _, err := l.Append(ctx, sampleEntry(1)); err == nil {
		t.Log("an append fit after the failure (space freed by the rollback)")
	}
	remount(t, dir, "size=64m")
	checkAfterFailure(t, l, path, acked, s)
}

// TestOpenFailsOnReadOnlyFS: a log on a read-only file system is not
// opened for appending (no silent read-only mode).
func TestOpenFailsOnReadOnlyFS(t *testing.T) {
	dir := mountTmpfs(t, "8m")
	path := filepath.Join(dir, "audit.db")
	l := openLog(t, path, testSigner(t, "k", 1))
	appendN(t, l, 0, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	remount(t, dir, "ro")
	if l, err := audit.Open(path, audit.Options{Origin: testOrigin}); err == nil {
		l.Close()
		t.Fatal("opened a log on a read-only file system for appending")
	} else {
		t.Logf("open on read-only fs: %v", err)
	}
	// Read-only access for auditors still works.
	l, err := audit.Open(path, audit.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Size() != 10 {
		t.Fatalf("size %d", l.Size())
	}
	if _, _, err := l.Append(context.Background(), sampleEntry(1)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("append to read-only log: %v", err)
	}
}

// TestOpenFailsOnReadOnlyFile: without write permission on the file (as a
// non-root user), Open fails.
func TestOpenFailsOnReadOnlyFile(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root ignores file modes; TestOpenFailsOnReadOnlyFS covers read-only storage")
	}
	path := filepath.Join(t.TempDir(), "audit.db")
	l := openLog(t, path, testSigner(t, "k", 1))
	l.Close()
	if err := os.Chmod(path, 0o400); err != nil {
		t.Fatal(err)
	}
	if l, err := audit.Open(path, audit.Options{Origin: testOrigin}); err == nil {
		l.Close()
		t.Fatal("opened a read-only file for appending")
	}
}

// TestAppendFailsClosedMaxSize is the same failure through bbolt's file
// size limit, which runs everywhere (no mount needed).
func TestAppendFailsClosedMaxSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	s := testSigner(t, "k", 1)
	l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: s, MaxSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	acked, err := fillUntilFailure(t, l, 1_000_000)
	if !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("append past MaxSize: %v", err)
	}
	l.Close()
	l, err = audit.Open(path, audit.Options{Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	checkAfterFailure(t, l, path, acked, s)
}

// Queries running while a failed commit makes the writer reopen the file
// must neither deadlock with it nor fail other than cleanly. (A query held
// the memory index while waiting for the file, and the recovery held the
// file while waiting for the index: a full disk hung the gateway's audit
// queries forever.)
func TestQueriesDuringFailedCommits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: testSigner(t, "k", 1), MaxSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// Closed only on success: on a deadlock Close would wait forever too.
	job := sampleEntry(0).JobID
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var queries atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, err := l.Query(context.Background(), audit.Filter{JobID: job}, audit.Page{Size: 10})
				if err != nil && !errors.Is(err, audit.ErrClosed) && !errors.Is(err, audit.ErrUnavailable) {
					t.Errorf("query during recovery: %v", err)
					return
				}
				queries.Add(1)
			}
		}()
	}
	// Fill the file, then keep failing: every failed commit reopens it.
	finished := make(chan error, 1)
	go func() {
		defer func() { close(stop); wg.Wait(); close(finished) }()
		for i := 0; ; i++ {
			if _, _, err := l.Append(context.Background(), sampleEntry(i)); err != nil {
				if !errors.Is(err, audit.ErrUnavailable) {
					finished <- fmt.Errorf("append past MaxSize: %w", err)
					return
				}
				break
			}
		}
		// Near the limit, some of these fit (freed pages) and most fail.
		for i := range 200 {
			if _, _, err := l.Append(context.Background(), sampleEntry(i)); err != nil && !errors.Is(err, audit.ErrUnavailable) {
				finished <- fmt.Errorf("append near MaxSize: %w", err)
				return
			}
		}
	}()
	select {
	case err := <-finished:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute): // a hang detector, not a speed check
		t.Fatal("appends and queries deadlocked with the writer's recovery")
	}
	if queries.Load() == 0 {
		t.Fatal("no query ran")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
