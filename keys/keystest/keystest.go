package keystest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// Opener opens the backend under test. Calling it again must reopen the
// same storage (a restart); the suite closes what it opens.
type Opener func(t *testing.T) keys.Backend

// Run runs the suite. Names are unique per run, so a shared server may
// hold other tests' keys.
func Run(t *testing.T, open Opener) {
	prefix := fmt.Sprintf("nqn.2026-01.io.nvmegate.test:conf-%d", time.Now().UnixNano())
	t.Run("Roots", func(t *testing.T) { testRoots(t, open, prefix+"-roots") })
	t.Run("ConcurrentRotation", func(t *testing.T) { testConcurrent(t, open, prefix+"-race") })
	t.Run("DataKeys", func(t *testing.T) { testDataKeys(t, open, prefix+"-dek/1") })
	t.Run("DataKeyRotation", func(t *testing.T) { testDataKeyRotation(t, open, prefix+"-dekrot/1") })
	t.Run("Restart", func(t *testing.T) { testRestart(t, open, prefix+"-restart") })
	t.Run("ManagerGraceAndSchedule", func(t *testing.T) { testManager(t, open, prefix+"-mgr") })
	t.Run("ReplicasFollowTheStore", func(t *testing.T) { testReplicaKeys(t, open, prefix+"-replicas/1") })
	t.Run("KeysUsedDuringRotations", func(t *testing.T) { testKeysDuringRotations(t, open, prefix+"-busy/1") })
}

func secret(t *testing.T) []byte {
	b := make([]byte, keys.RootSize)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func openClosed(t *testing.T, open Opener) keys.Backend {
	b := open(t)
	t.Cleanup(func() { b.Close() })
	return b
}

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

func testRoots(t *testing.T, open Opener, sub string) {
	ctx := context.Background()
	b := openClosed(t, open)
	if rs, err := b.Roots(ctx, sub); err != nil || len(rs) != 0 {
		t.Fatalf("new subsystem: %v %v", rs, err)
	}
	s1 := secret(t)
	rs, err := b.AddRoot(ctx, sub, 0, s1, t0, t0.Add(-time.Hour))
	if err != nil || len(rs) != 1 || rs[0].Version != 1 || !bytes.Equal(rs[0].Secret, s1) || !rs[0].Created.Equal(t0) {
		t.Fatalf("first root: %v %v", rs, err)
	}
	if _, err := b.AddRoot(ctx, sub, 0, secret(t), t0, t0); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("second v1: %v, want ErrConflict", err)
	}
	if _, err := b.AddRoot(ctx, sub, 5, secret(t), t0, t0); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("stale prev: %v, want ErrConflict", err)
	}
	t1 := t0.Add(time.Hour)
	s2 := secret(t)
	rs, err = b.AddRoot(ctx, sub, 1, s2, t1, t1.Add(-time.Hour))
	if err != nil || len(rs) != 2 || rs[1].Version != 2 || !rs[0].Superseded.Equal(t1) || !rs[1].Superseded.IsZero() {
		t.Fatalf("second root: %v %v", rs, err)
	}
	got, err := b.Roots(ctx, sub)
	if err != nil || len(got) != 2 || !bytes.Equal(got[0].Secret, s1) || !bytes.Equal(got[1].Secret, s2) {
		t.Fatalf("read back: %v %v", got, err)
	}
	// Versions superseded before dropBefore are dropped (v1, superseded
	// 3h ago); the one superseded now stays.
	t2 := t1.Add(3 * time.Hour)
	rs, err = b.AddRoot(ctx, sub, 2, secret(t), t2, t2.Add(-time.Hour))
	if err != nil || len(rs) != 2 || rs[0].Version != 2 || rs[1].Version != 3 {
		t.Fatalf("after pruning: %v %v", rs, err)
	}
	subs, err := b.Subsystems(ctx)
	if err != nil || !contains(subs, sub) {
		t.Fatalf("Subsystems %v %v", subs, err)
	}
	if _, err := b.AddRoot(ctx, sub, 3, []byte("short"), t2, t2); !errors.Is(err, keys.ErrInvalid) {
		t.Fatalf("short secret: %v", err)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Many writers with the same prev: exactly one wins (check-and-set), as two
// gateways rotating the same root at once must make one new version.
func testConcurrent(t *testing.T, open Opener, sub string) {
	ctx := context.Background()
	b := openClosed(t, open)
	if _, err := b.AddRoot(ctx, sub, 0, secret(t), t0, t0); err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, conflicts := 0, 0
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.AddRoot(ctx, sub, 1, secret(t), t0.Add(time.Minute), t0)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, keys.ErrConflict):
				conflicts++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	rs, err := b.Roots(ctx, sub)
	if wins != 1 || conflicts != n-1 || err != nil || rs[len(rs)-1].Version != 2 {
		t.Fatalf("%d wins, %d conflicts, current %v (%v); want exactly one new version", wins, conflicts, rs, err)
	}
}

func testDataKeys(t *testing.T, open Opener, ns string) {
	ctx := context.Background()
	b := openClosed(t, open)
	if _, err := b.DataKey(ctx, ns); !errors.Is(err, keys.ErrNotFound) {
		t.Fatalf("absent data key: %v", err)
	}
	w1, err := b.CreateDataKey(ctx, ns, "rec-1")
	if err != nil || w1.KEKVersion != 1 || w1.Ciphertext == "" {
		t.Fatalf("create: %+v %v", w1, err)
	}
	if _, err := b.CreateDataKey(ctx, ns, "rec-2"); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("second create: %v", err)
	}
	stored, err := b.DataKey(ctx, ns)
	if err != nil || stored.Wrapped != w1 || stored.Owner != "rec-1" || stored.Next != nil {
		t.Fatalf("stored %+v %v", stored, err)
	}
	dek, err := b.Unwrap(ctx, ns, w1)
	if err != nil || len(dek) != 32 {
		t.Fatalf("unwrap: %d bytes, %v", len(dek), err)
	}
	if bytes.Contains([]byte(w1.Ciphertext), dek) {
		t.Fatal("ciphertext contains the key")
	}
	w2, err := b.RotateDataKey(ctx, ns)
	if err != nil || w2.KEKVersion != 2 || w2.Ciphertext == w1.Ciphertext {
		t.Fatalf("rotate: %+v %v", w2, err)
	}
	if rec, err := b.DataKey(ctx, ns); err != nil || rec.Owner != "rec-1" {
		t.Fatalf("the owner after a KEK rotation: %+v %v", rec, err)
	}
	for _, w := range []keys.Wrapped{w1, w2} {
		if d, err := b.Unwrap(ctx, ns, w); err != nil || !bytes.Equal(d, dek) {
			t.Fatalf("unwrap KEK v%d after rotation: %v", w.KEKVersion, err)
		}
	}
	vs, err := b.KEKVersions(ctx, ns)
	if err != nil || len(vs) != 2 || vs[0].Version != 1 || vs[1].Version != 2 || vs[1].Created.IsZero() {
		t.Fatalf("KEK versions %+v %v", vs, err)
	}
	bad := w2
	bad.Ciphertext = bad.Ciphertext[:len(bad.Ciphertext)-4] + "AAAA"
	if _, err := b.Unwrap(ctx, ns, bad); err == nil {
		t.Fatal("a corrupted ciphertext unwrapped")
	}
	if _, err := b.RotateDataKey(ctx, ns+"-absent"); !errors.Is(err, keys.ErrNotFound) {
		t.Fatalf("rotate absent: %v", err)
	}

	// Crypto-erase: the data key and every KEK version go; no wrapped
	// copy unwraps after; a new data key for the name is a new key.
	if err := b.DestroyDataKey(ctx, ns); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	if _, err := b.DataKey(ctx, ns); !errors.Is(err, keys.ErrNotFound) {
		t.Fatalf("data key after destroy: %v", err)
	}
	for _, w := range []keys.Wrapped{w1, w2} {
		if d, err := b.Unwrap(ctx, ns, w); err == nil || bytes.Equal(d, dek) {
			t.Fatalf("a wrapped copy (KEK v%d) unwrapped after destroy", w.KEKVersion)
		} else if !errors.Is(err, keys.ErrNotFound) {
			t.Fatalf("unwrap after destroy: %v, want ErrNotFound (the KEK is gone)", err)
		}
	}
	if vs, err := b.KEKVersions(ctx, ns); err != nil || len(vs) != 0 {
		t.Fatalf("KEK versions after destroy: %+v %v", vs, err)
	}
	if err := b.DestroyDataKey(ctx, ns); !errors.Is(err, keys.ErrNotFound) {
		t.Fatalf("second destroy: %v", err)
	}
	w3, err := b.CreateDataKey(ctx, ns, "rec-2")
	if err != nil {
		t.Fatalf("create after destroy: %v", err)
	}
	if d, err := b.Unwrap(ctx, ns, w3); err != nil || bytes.Equal(d, dek) {
		t.Fatalf("the new data key after destroy: equal to the old one, or %v", err)
	}
}

// A data-key rotation: the next key is a new key of the next generation,
// kept beside the current one (and the same one when asked again, after a
// restart too) until the commit; after it, the old data key unwraps from
// no copy, and a stale commit is refused.
func testDataKeyRotation(t *testing.T, open Opener, ns string) {
	ctx := context.Background()
	b := openClosed(t, open)
	if _, err := b.BeginDataKeyRotation(ctx, ns); !errors.Is(err, keys.ErrNotFound) {
		t.Fatalf("begin without a data key: %v", err)
	}
	w1, err := b.CreateDataKey(ctx, ns, "rec-1")
	if err != nil || w1.Gen() != 1 {
		t.Fatalf("create: %+v %v", w1, err)
	}
	if rec, err := b.DataKey(ctx, ns); err != nil || rec.Next != nil {
		t.Fatalf("next before a rotation: %+v %v", rec.Next, err)
	}
	if _, err := b.CommitDataKeyRotation(ctx, ns, 2); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("commit with nothing under way: %v", err)
	}
	old, _ := b.Unwrap(ctx, ns, w1)
	w1r, err := b.RotateDataKey(ctx, ns) // a KEK rotation first: its version must go too
	if err != nil {
		t.Fatal(err)
	}
	n, err := b.BeginDataKeyRotation(ctx, ns)
	if err != nil || n.Gen() != 2 {
		t.Fatalf("begin: %+v %v", n, err)
	}
	next, err := b.Unwrap(ctx, ns, n)
	if err != nil || len(next) != 32 || bytes.Equal(next, old) {
		t.Fatalf("the next data key: %v (or equal to the current one)", err)
	}
	b.Close()
	b = openClosed(t, open)
	if again, err := b.BeginDataKeyRotation(ctx, ns); err != nil || again != n {
		t.Fatalf("a second begin made another key: %+v %v", again, err)
	}
	if rec, err := b.DataKey(ctx, ns); err != nil || rec.Next == nil || *rec.Next != n {
		t.Fatalf("next: %+v %v", rec.Next, err)
	} else if rec.Wrapped != w1r || rec.Owner != "rec-1" {
		t.Fatalf("the current key changed before the commit: %+v", rec)
	}
	if d, err := b.Unwrap(ctx, ns, w1r); err != nil || !bytes.Equal(d, old) {
		t.Fatalf("the current key no longer unwraps during the rotation: %v", err)
	}
	if _, err := b.CommitDataKeyRotation(ctx, ns, 3); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("commit of a generation not under way: %v", err)
	}
	c, err := b.CommitDataKeyRotation(ctx, ns, 2)
	if err != nil || c != n {
		t.Fatalf("commit: %+v %v", c, err)
	}
	if cur, err := b.DataKey(ctx, ns); err != nil || cur.Wrapped != n || cur.Next != nil || cur.Owner != "rec-1" {
		t.Fatalf("after commit: %+v %v (want generation 2, nothing next, the same owner)", cur, err)
	}
	for _, w := range []keys.Wrapped{w1, w1r} {
		if d, err := b.Unwrap(ctx, ns, w); err == nil || bytes.Equal(d, old) {
			t.Fatalf("the old data key (KEK v%d) unwraps after the commit", w.KEKVersion)
		}
	}
	if c2, err := b.CommitDataKeyRotation(ctx, ns, 2); err != nil || c2 != n {
		t.Fatalf("a repeated commit: %+v %v", c2, err)
	}
	if _, err := b.CommitDataKeyRotation(ctx, ns, 1); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("a stale commit: %v", err)
	}
	vs, err := b.KEKVersions(ctx, ns)
	if err != nil || len(vs) != 1 || vs[0].Version != 1 {
		t.Fatalf("KEK versions of generation 2: %+v %v", vs, err)
	}
	w2r, err := b.RotateDataKey(ctx, ns)
	if err != nil || w2r.Gen() != 2 || w2r.KEKVersion != 2 {
		t.Fatalf("a KEK rotation of generation 2: %+v %v", w2r, err)
	}
	if d, err := b.Unwrap(ctx, ns, w2r); err != nil || !bytes.Equal(d, next) {
		t.Fatalf("the rewrapped generation 2: %v", err)
	}
	// A rotation under way, then crypto-erase: both generations go.
	n3, err := b.BeginDataKeyRotation(ctx, ns)
	if err != nil || n3.Gen() != 3 {
		t.Fatalf("begin 3: %+v %v", n3, err)
	}
	if err := b.DestroyDataKey(ctx, ns); err != nil {
		t.Fatal(err)
	}
	for _, w := range []keys.Wrapped{w2r, n3} {
		if _, err := b.Unwrap(ctx, ns, w); err == nil {
			t.Fatalf("generation %d unwraps after crypto-erase", w.Gen())
		}
	}
}

func testRestart(t *testing.T, open Opener, sub string) {
	ctx := context.Background()
	b := open(t)
	s := secret(t)
	if _, err := b.AddRoot(ctx, sub, 0, s, t0, t0); err != nil {
		t.Fatal(err)
	}
	w, err := b.CreateDataKey(ctx, sub+"/1", "rec-1")
	if err != nil {
		t.Fatal(err)
	}
	dek, err := b.Unwrap(ctx, sub+"/1", w)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openClosed(t, open)
	rs, err := b.Roots(ctx, sub)
	if err != nil || len(rs) != 1 || !bytes.Equal(rs[0].Secret, s) {
		t.Fatalf("roots after reopen: %v %v", rs, err)
	}
	w2, err := b.DataKey(ctx, sub+"/1")
	if err != nil || w2.Wrapped != w || w2.Owner != "rec-1" {
		t.Fatalf("data key after reopen: %+v %v", w2, err)
	}
	if d, err := b.Unwrap(ctx, sub+"/1", w2.Wrapped); err != nil || !bytes.Equal(d, dek) {
		t.Fatalf("unwrap after reopen: %v", err)
	}
}

// clock is a fake clock the test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// The Manager over the backend: derivation from the current root, the
// grace period of superseded versions, scheduled rotation and the
// staleness bound, all on a fake clock.
func testManager(t *testing.T, open Opener, sub string) {
	ctx := context.Background()
	b := openClosed(t, open)
	clk := &clock{now: t0}
	var events []keys.RotationEvent
	m, err := keys.NewManager(keys.Options{Backend: b, Now: clk.Now, Grace: time.Hour, RotationPeriod: 24 * time.Hour,
		MaxStaleness: 10 * time.Minute, OnRotate: func(_ context.Context, e keys.RotationEvent) error { events = append(events, e); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	host := "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	p := keys.CredentialParams{DHCHAPHash: nvmefmt.SHA384, Bidirectional: true, TLSHash: nvmefmt.SHA256}
	c1, err := m.Credentials(ctx, host, sub, p)
	if err != nil || c1.RootVersion != 1 || len(events) != 1 || events[0].Reason != "first use" {
		t.Fatalf("first credentials: %v %v %v", c1, err, events)
	}
	if again, _ := m.Credentials(ctx, host, sub, p); again != c1 {
		t.Fatal("credentials are not stable for one root version")
	}
	// A day later the schedule rotates it.
	clk.Add(24 * time.Hour)
	m.Tick(ctx)
	c2, err := m.Credentials(ctx, host, sub, p)
	if err != nil || c2.RootVersion != 2 || c2.HostSecret == c1.HostSecret || len(events) != 2 || events[1].Reason != "scheduled" {
		t.Fatalf("after the scheduled rotation: %v %v %v", c2, err, events)
	}
	// v1 serves renewals within the grace, then is refused.
	if old, err := m.CredentialsAt(ctx, host, sub, 1, p); err != nil || old != c1 {
		t.Fatalf("v1 within grace: %v", err)
	}
	clk.Add(time.Hour)
	m.Tick(ctx) // the background refresh
	if _, err := m.CredentialsAt(ctx, host, sub, 1, p); !errors.Is(err, keys.ErrExpired) {
		t.Fatalf("v1 after grace: %v, want ErrExpired", err)
	}
	st, err := m.Status(ctx, sub)
	if err != nil || st.Current != 2 || !st.NextRotation.Equal(t0.Add(48*time.Hour)) || st.Versions[0].Fingerprint == "" {
		t.Fatalf("status %+v %v", st, err)
	}
	// Revocation rotates at once.
	if err := m.Revoked(ctx, sub, "job j1 finished"); err != nil {
		t.Fatal(err)
	}
	if c3, err := m.Credentials(ctx, host, sub, p); err != nil || c3.RootVersion != 3 {
		t.Fatalf("after revocation: %v %v", c3, err)
	}
	// Data keys: created on first use, rotated by the schedule once their
	// KEK is older than the period (the backend stamps KEKs with the real
	// clock; the fake one is days ahead).
	ns := sub + "/1"
	k1, err := m.NamespaceKeys(ctx, ns, "rec-1")
	if err != nil || k1.Wrapped.KEKVersion != 1 || len(k1.Key) != 32 || k1.Next != nil {
		t.Fatalf("data key: %+v %v", k1.Wrapped, err)
	}
	dek := k1.Key
	// Past the period by the backend's clock too, which is the real one:
	// t0 is a fixed date the real clock has long passed.
	clk.Add(91*24*time.Hour + max(0, time.Since(clk.Now())))
	m.Tick(ctx)
	w2, err := b.DataKey(ctx, ns)
	if err != nil || w2.KEKVersion != 2 {
		t.Fatalf("after the data key period: %+v %v", w2, err)
	}
	if d, err := b.Unwrap(ctx, ns, w2.Wrapped); err != nil || !bytes.Equal(d, dek) {
		t.Fatalf("rewrapped data key: %v", err)
	}
	if last := events[len(events)-1]; last.Kind != "data_key" || last.Reason != "scheduled" || last.Version != 2 {
		t.Fatalf("rotation event %+v", last)
	}
	// The unwrapped key is kept: the same key, its latest wrapping, one
	// read of the record to confirm it and one unwrap of the new wrapping;
	// asked again, the read alone.
	reads := m.BackendReads()
	if k, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil || !bytes.Equal(k.Key, dek) || k.Wrapped.KEKVersion != 2 || m.BackendReads()-reads != 2 {
		t.Fatalf("kept data key: v%d, %v, %d backend reads", k.Wrapped.KEKVersion, err, m.BackendReads()-reads)
	}
	reads = m.BackendReads()
	if k, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil || !bytes.Equal(k.Key, dek) || m.BackendReads()-reads != 1 {
		t.Fatalf("kept data key asked again: %v, %d backend reads, want 1", err, m.BackendReads()-reads)
	}
	// Another record of the same name never gets it.
	if _, err := m.NamespaceKeys(ctx, ns, "rec-2"); !errors.Is(err, keys.ErrForeign) {
		t.Fatalf("another record's data key: %v, want ErrForeign", err)
	}
	if err := m.EnsureDataKey(ctx, ns, "rec-2"); !errors.Is(err, keys.ErrForeign) {
		t.Fatalf("EnsureDataKey for another record: %v, want ErrForeign", err)
	}
	if _, _, err := m.DataKeyGeneration(ctx, ns, "rec-2"); !errors.Is(err, keys.ErrForeign) {
		t.Fatalf("DataKeyGeneration for another record: %v, want ErrForeign", err)
	}
	// A data-key rotation: the next key is served beside the current one,
	// and after the commit it is the current one.
	nw, err := m.BeginDataKeyRotation(ctx, ns, "test rotation")
	if err != nil || nw.Gen() != 2 {
		t.Fatalf("begin: %+v %v", nw, err)
	}
	if last := events[len(events)-1]; last.Kind != keys.KindDataKeyReencrypt || last.Outcome != "begun" || last.Version != 2 {
		t.Fatalf("begin event %+v", last)
	}
	k, err := m.NamespaceKeys(ctx, ns, "rec-1")
	if err != nil || k.Next == nil || bytes.Equal(k.Next, dek) || k.NextWrapped.Gen() != 2 {
		t.Fatalf("next data key: none, the current one, or %v", err)
	}
	if !bytes.Equal(k.Key, dek) {
		t.Fatal("the current data key changed before the commit")
	}
	next := k.Next
	if _, err := m.CommitDataKeyRotation(ctx, ns, 3, "test commit"); !errors.Is(err, keys.ErrConflict) {
		t.Fatalf("commit of another generation: %v", err)
	}
	if _, err := m.CommitDataKeyRotation(ctx, ns, 2, "test commit"); err != nil {
		t.Fatal(err)
	}
	if last := events[len(events)-1]; last.Kind != keys.KindDataKeyReencrypt || last.Outcome != "applied" || last.Version != 2 {
		t.Fatalf("commit event %+v", last)
	}
	if k, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil || !bytes.Equal(k.Key, next) || k.Wrapped.Gen() != 2 || k.Next != nil {
		t.Fatalf("after the commit: the next key is not the current one (gen %d, %v)", k.Wrapped.Gen(), err)
	}
	dek = next
	if err := m.DestroyDataKey(ctx, ns, "test erase"); err != nil {
		t.Fatal(err)
	}
	if k, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil || bytes.Equal(k.Key, dek) {
		t.Fatalf("the data key after a crypto-erase: the old key, or %v", err)
	}
	// Past the staleness bound without a refresh, issuance fails closed.
	clk.Add(11 * time.Minute)
	if _, err := m.Credentials(ctx, host, sub, p); !errors.Is(err, keys.ErrUnavailable) {
		t.Fatalf("stale cache: %v, want ErrUnavailable", err)
	}
	m.Tick(ctx) // a refresh that succeeds restores service
	if _, err := m.Credentials(ctx, host, sub, p); err != nil {
		t.Fatalf("after refresh: %v", err)
	}
}

// Two managers on one key store stand for two gateway replicas on one
// Vault (issue 29): what one changes, the other serves at once — the
// generation a re-encryption committed, one begun, a crypto-erase — and
// a namespace added again under the same name never gets the key of the
// record removed before it.
func testReplicaKeys(t *testing.T, open Opener, ns string) {
	ctx := context.Background()
	b := openClosed(t, open)
	mgr := func() *keys.Manager {
		m, err := keys.NewManager(keys.Options{Backend: b})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, r := mgr(), mgr()
	k1, err := a.NamespaceKeys(ctx, ns, "rec-1")
	if err != nil {
		t.Fatal(err)
	}
	if k, err := r.NamespaceKeys(ctx, ns, "rec-1"); err != nil || !bytes.Equal(k.Key, k1.Key) {
		t.Fatalf("the second replica's data key differs, or %v", err)
	}
	// A re-encryption begun through r: a is asked next and serves the next
	// key (it kept "none under way" before).
	if _, err := r.BeginDataKeyRotation(ctx, ns, "test"); err != nil {
		t.Fatal(err)
	}
	ka, err := a.NamespaceKeys(ctx, ns, "rec-1")
	if err != nil || ka.Next == nil || ka.NextWrapped.Gen() != 2 {
		t.Fatalf("a re-encryption begun on another replica is invisible: next %v, %v", ka.NextWrapped, err)
	}
	// Committed through r: a serves generation 2 as the current key, never
	// generation 1 again.
	if _, err := r.CommitDataKeyRotation(ctx, ns, 2, "test"); err != nil {
		t.Fatal(err)
	}
	ka2, err := a.NamespaceKeys(ctx, ns, "rec-1")
	if err != nil || ka2.Wrapped.Gen() != 2 || !bytes.Equal(ka2.Key, ka.Next) || bytes.Equal(ka2.Key, k1.Key) || ka2.Next != nil {
		t.Fatalf("after a commit on another replica: generation %d (want 2, the old key gone), %v", ka2.Wrapped.Gen(), err)
	}
	// Crypto-erased through r: a never serves the erased key; a namespace
	// added again (another record) gets a new key.
	if err := r.DestroyDataKey(ctx, ns, "test erase"); err != nil {
		t.Fatal(err)
	}
	ka3, err := a.NamespaceKeys(ctx, ns, "rec-2")
	if err != nil || bytes.Equal(ka3.Key, ka2.Key) || bytes.Equal(ka3.Key, k1.Key) {
		t.Fatalf("after a crypto-erase on another replica: the erased key served, or %v", err)
	}
	// Removed without erase and added again: the key stays rec-2's, on
	// both replicas.
	for i, m := range []*keys.Manager{a, r} {
		if _, err := m.NamespaceKeys(ctx, ns, "rec-3"); !errors.Is(err, keys.ErrForeign) {
			t.Fatalf("replica %d gave a key left by a removed namespace to a new one: %v", i, err)
		}
		if err := m.EnsureDataKey(ctx, ns, "rec-3"); !errors.Is(err, keys.ErrForeign) {
			t.Fatalf("replica %d: EnsureDataKey adopted a foreign key: %v", i, err)
		}
	}
	// A root rotated through r is used by a once a expires its kept
	// roots of the scope (a replica does on applying a revocation).
	sub := ns + "-root"
	host := "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	p := keys.CredentialParams{DHCHAPHash: nvmefmt.SHA256}
	c1, err := a.Credentials(ctx, host, sub, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Rotate(ctx, sub, "test"); err != nil {
		t.Fatal(err)
	}
	if c, err := a.Credentials(ctx, host, sub, p); err != nil || c.RootVersion != c1.RootVersion {
		t.Fatalf("before Expire: v%d, %v (want the kept v%d: the refresh has not run)", c.RootVersion, err, c1.RootVersion)
	}
	a.Expire(sub)
	if c, err := a.Credentials(ctx, host, sub, p); err != nil || c.RootVersion != c1.RootVersion+1 {
		t.Fatalf("after Expire: v%d, %v (want v%d, rotated through the other manager)", c.RootVersion, err, c1.RootVersion+1)
	}

	// A key made before owners were recorded belongs only to a record
	// from before incarnations.
	legacy := ns + "0"
	if _, err := b.CreateDataKey(ctx, legacy, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := a.NamespaceKeys(ctx, legacy, "rec-4"); !errors.Is(err, keys.ErrForeign) {
		t.Fatalf("an unowned key given to a new record: %v", err)
	}
	if _, err := a.NamespaceKeys(ctx, legacy, ""); err != nil {
		t.Fatalf("an unowned key refused to its own (old) record: %v", err)
	}
}

// A manager's kept keys used while the same manager commits
// re-encryptions: every key handed out is a whole key of the namespace,
// never one zeroed in place by the commit (run with -race too).
func testKeysDuringRotations(t *testing.T, open Opener, ns string) {
	ctx := context.Background()
	b := openClosed(t, open)
	m, err := keys.NewManager(keys.Options{Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 32)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				k, err := m.NamespaceKeys(ctx, ns, "rec-1")
				if err != nil {
					t.Error(err)
					return
				}
				if bytes.Equal(k.Key, zero) || (k.Next != nil && bytes.Equal(k.Next, zero)) {
					t.Error("a zeroed data key was handed out")
					return
				}
			}
		})
	}
	for gen := uint64(2); gen <= 6; gen++ {
		if _, err := m.BeginDataKeyRotation(ctx, ns, "test"); err != nil {
			t.Fatal(err)
		}
		if _, err := m.CommitDataKeyRotation(ctx, ns, gen, "test"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
