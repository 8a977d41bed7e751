package store_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// BenchmarkReplay measures a full replay: a new store (a new replica, or
// `nvmegated replay`) opened on a journal of NVMEGATE_REPLAY_GRANTS grants
// (default 20,000), each one change and one entry, written by 64
// concurrent connects of 10,000 nodes that supersede their earlier grants,
// as a cluster's log grows. Each iteration replays the whole journal into
// a fresh file and checks the state digest equals the writer's.
//
//	NVMEGATE_REPLAY_GRANTS=1000000 go test -run '^$' -bench Replay -benchtime 1x ./store
func BenchmarkReplay(b *testing.B) {
	n := 20_000
	if v := os.Getenv("NVMEGATE_REPLAY_GRANTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			b.Fatalf("NVMEGATE_REPLAY_GRANTS=%q: a positive count is required", v)
		}
	}
	dir := b.TempDir()
	log, db := openJournaled(func(a ...any) { b.Fatal(a...) }, dir, "store.db", time.Second)
	start := time.Now()
	fillFleet(b, db, n)
	fill := time.Since(start)
	rev, want, err := db.StateDigest(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	// The writer's file is not needed again: its disk goes to the replay.
	if err := os.Remove(filepath.Join(dir, "store.db")); err != nil {
		b.Fatal(err)
	}
	entries := log.Size()
	fi, err := os.Stat(filepath.Join(dir, "audit.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d grants in %v (%.0f/s): %d entries, revision %d, log %d MiB",
		n, fill.Round(time.Millisecond), float64(n)/fill.Seconds(), entries, rev, fi.Size()>>20)

	// The replay's own peak RSS: Linux resets VmHWM on "5" to clear_refs.
	resetPeak := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		path := filepath.Join(dir, fmt.Sprintf("fresh-%d.db", i))
		fresh, err := store.Open(path, store.Options{Journal: log, CheckpointInterval: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		frev, got, err := fresh.StateDigest(context.Background())
		if err != nil || frev != rev || got != want {
			b.Fatalf("replay: revision %d %s (%v), want %d %s", frev, got, err, rev, want)
		}
		fresh.Close()
		os.Remove(path)
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(entries), "ns/entry")
	b.ReportMetric(float64(entries)*float64(b.N)/b.Elapsed().Seconds(), "entries/s")
	if resetPeak {
		b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-RSS-MiB")
	}
}

// peakRSS is VmHWM of this process, in bytes.
func peakRSS(tb testing.TB) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				tb.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// fillFleet writes an inventory and n grants from 64 writers at once: node
// i%10,000 connects, superseding its grant before.
func fillFleet(tb testing.TB, db *store.DB, n int) {
	ctx := context.Background()
	sub := journalInventory(func(a ...any) { tb.Fatal(a...) }, db)
	const writers, nodes = 64, 10_000
	t0 := time.Date(2026, 12, 5, 9, 0, 0, 0, time.UTC)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				node := i % nodes
				g := &nvmegate.Grant{ID: fmt.Sprintf("grant-%08d", i), JobID: "job-1", Tenant: "acme",
					Node:    fmt.Sprintf("spiffe://example.org/node/n%05d", node),
					HostNQN: fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-4000-8000-%012x", node, node), SubsystemNQN: sub, KeyVersion: 1,
					IssuedAt: t0, ExpiresAt: t0.Add(time.Hour), State: nvmegate.GrantActive, DecisionID: "d", DHCHAPHash: "sha384", DHGroup: "ffdhe3072"}
				if _, err := db.OpenGrant(ctx, g, nil, true, nil); err != nil {
					errs <- fmt.Errorf("grant %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}

// A long replay checkpoints as it goes, so that it holds a bounded number
// of changes in memory. A replay that stops at a tampered change leaves
// the fresh file at a checkpoint before it, not empty.
func TestReplayCheckpointsAsItGoes(t *testing.T) {
	dir := t.TempDir()
	log, db := openJournaled(t.Fatal, dir, "store.db", time.Hour)
	fillFleet(t, db, 2500)
	mustJ(t, db.Close())
	mustJ(t, log.Close())
	const tampered = 2000
	raw, err := bolt.Open(filepath.Join(dir, "audit.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustJ(t, raw.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("changes"))
		k := binary.BigEndian.AppendUint64(nil, tampered)
		v := bytes.Clone(b.Get(k))
		if len(v) < 9 {
			return fmt.Errorf("no change %d in the journal", tampered)
		}
		v[len(v)-1] ^= 1
		return b.Put(k, v)
	}))
	mustJ(t, raw.Close())

	log, err = audit.Open(filepath.Join(dir, "audit.db"), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	path := filepath.Join(dir, "fresh.db")
	if fresh, err := store.Open(path, store.Options{Journal: log}); err == nil {
		fresh.Close()
		t.Fatal("a replay over a tampered change succeeded")
	} else if !errors.Is(err, audit.ErrCorrupt) {
		t.Fatalf("replay over a tampered change: %v, want ErrCorrupt", err)
	}
	fresh, err := store.Open(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	if rev := fresh.Revision(); rev == 0 || rev >= tampered {
		t.Fatalf("the fresh file is at revision %d after a replay stopped at %d: want a checkpoint between", rev, tampered)
	}
}
