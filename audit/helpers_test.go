package audit_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	bolt "go.etcd.io/bbolt"
)

const testOrigin = "nvmegate.test/audit"

// testSigner returns a deterministic Ed25519 signer: seed = SHA-256(name).
func testSigner(t testing.TB, name string, version uint64) *attest.LocalSigner {
	seed := sha256.Sum256([]byte(name))
	s, err := attest.NewLocalSigner(ed25519.NewKeyFromSeed(seed[:]), version)
	if err != nil {
		panic(err)
	}
	return s
}

// fixedClock returns a clock that advances one millisecond per call from a
// fixed instant.
func fixedClock() func() time.Time {
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var n atomic.Int64
	return func() time.Time {
		return t0.Add(time.Duration(n.Add(1)) * time.Millisecond)
	}
}

func openLog(t testing.TB, path string, s attest.Signer) *audit.Log {
	t.Helper()
	l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: s, Now: fixedClock()})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newLog(t testing.TB) (*audit.Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.db")
	l := openLog(t, path, testSigner(t, "key-v1", 1))
	t.Cleanup(func() { l.Close() })
	return l, path
}

// sampleEntry returns a realistic grant entry for job i.
func sampleEntry(i int) audit.Entry {
	job := fmt.Sprintf("job-%d", i%50)
	sub := fmt.Sprintf("nqn.2026-01.io.nvmegate:sub-%d", i%7)
	return audit.Entry{
		Kind:         audit.EventGrant,
		JobID:        job,
		Tenant:       fmt.Sprintf("tenant-%d", i%5),
		Caller:       "spiffe://example.org/node/gpu-" + fmt.Sprint(i%64),
		HostNQN:      "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
		SubsystemNQN: sub,
		Namespaces: []audit.Namespace{{SubsystemNQN: sub, NSID: uint32(1 + i%3), Mode: "ro",
			Dataset: "imagenet-21k", DatasetDigest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}},
		Decision: &audit.Decision{Allow: true, ID: fmt.Sprintf("dec-%08d", i), PolicyRevision: "rev-42",
			Reasons: []string{"tenant matches", "region eu-west allowed"}},
		Keys: []audit.KeyRef{{Class: "access_root", ID: sub, Version: 3,
			Fingerprint: "hmac-sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"}},
		GrantID:   fmt.Sprintf("grant-%d", i),
		ExpiresAt: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
	}
}

func appendN(t testing.TB, l *audit.Log, from, n int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < from+n; i++ {
		if _, _, err := l.Append(ctx, sampleEntry(i)); err != nil {
			t.Fatal(err)
		}
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func containsAny(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// injectCheckpoint stores cp's note in the checkpoints bucket of the closed
// log file at path, as a tamperer with write access to the file could.
func injectCheckpoint(t testing.TB, path string, cp audit.Checkpoint) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("checkpoints")).Put(binary.BigEndian.AppendUint64(nil, cp.Size), cp.Note)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// appendParallel appends sampleEntry(from..from+n) from 64 goroutines
// (group commit makes that fast); index order is then arbitrary.
func appendParallel(t testing.TB, l *audit.Log, from, n int) {
	t.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if _, _, err := l.Append(context.Background(), sampleEntry(i)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := from; i < from+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
}
