package audit_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"
	"sync"
	"testing"

	"github.com/nvmegate/nvmegate/audit"
)

// recorder is a proposal that records what the log did with it.
type recorder struct {
	mu      *sync.Mutex
	events  *[]string
	name    string
	rev     uint64
	refuse  error
	entries int
}

func (r recorder) Prepare(first uint64) (audit.Prepared, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.events = append(*r.events, fmt.Sprintf("prepare %s at %d", r.name, first))
	if r.refuse != nil {
		return audit.Prepared{}, r.refuse
	}
	var es []audit.Entry
	for i := 0; i < r.entries; i++ {
		e := sampleEntry(int(first) + i)
		es = append(es, e)
	}
	return audit.Prepared{Entries: es, Revision: r.rev, Payload: []byte("payload of " + r.name)}, nil
}

func (r recorder) Done(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.events = append(*r.events, fmt.Sprintf("done %s %v", r.name, err))
}

func TestProposeAppendsEntriesAndPayloadInOneCommit(t *testing.T) {
	l, _ := newLog(t)
	ctx := context.Background()
	appendN(t, l, 0, 3)
	var mu sync.Mutex
	var events []string
	rec := func(name string, rev uint64, n int, refuse error) recorder {
		return recorder{mu: &mu, events: &events, name: name, rev: rev, entries: n, refuse: refuse}
	}
	first, err := l.Propose(ctx, rec("a", 1, 2, nil))
	if err != nil || first != 3 {
		t.Fatalf("Propose a = %d, %v; want index 3", first, err)
	}
	// A refused proposal takes no index: the next one is at 5.
	refusal := errors.New("the rules refuse it")
	if _, err := l.Propose(ctx, rec("b", 2, 1, refusal)); !errors.Is(err, refusal) {
		t.Fatalf("Propose b = %v, want the refusal", err)
	}
	if first, err := l.Propose(ctx, rec("c", 2, 1, nil)); err != nil || first != 5 {
		t.Fatalf("Propose c = %d, %v; want index 5", first, err)
	}
	want := []string{"prepare a at 3", "done a <nil>", "prepare b at 5", "prepare c at 5", "done c <nil>"}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Fatalf("events %q, want %q", events, want)
	}
	if l.Size() != 6 {
		t.Fatalf("size %d, want 6", l.Size())
	}
	// The payloads sit beside the entries, and each proposal's first entry
	// commits to its payload's digest and revision.
	var got []string
	if err := l.Changes(ctx, 0, func(rev, index uint64, payload []byte) error {
		got = append(got, fmt.Sprintf("%d@%d:%s", rev, index, payload))
		recs, _, err := l.Query(ctx, audit.Filter{}, audit.Page{})
		if err != nil || uint64(len(recs)) <= index {
			return fmt.Errorf("entry %d: %v (%d records)", index, err, len(recs))
		}
		c := recs[index].Entry.Change
		if c == nil || c.Revision != rev || c.Digest != audit.PayloadDigest(payload) {
			return fmt.Errorf("entry %d carries change %+v, want revision %d digest %s", index, c, rev, audit.PayloadDigest(payload))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := "[1@3:payload of a 2@5:payload of c]"; fmt.Sprint(got) != want {
		t.Fatalf("changes %v, want %s", got, want)
	}
	if rev, err := l.LastChange(); err != nil || rev != 2 {
		t.Fatalf("LastChange = %d, %v; want 2", rev, err)
	}
}

func TestProposeRefusesARevisionOutOfOrder(t *testing.T) {
	l, _ := newLog(t)
	var mu sync.Mutex
	var events []string
	ctx := context.Background()
	if _, err := l.Propose(ctx, recorder{mu: &mu, events: &events, name: "a", rev: 5, entries: 1}); err != nil {
		t.Fatal(err)
	}
	// A revision not after the last one stored fails the commit, and the
	// proposal hears so (to undo what it prepared).
	if _, err := l.Propose(ctx, recorder{mu: &mu, events: &events, name: "b", rev: 5, entries: 1}); err == nil {
		t.Fatal("a repeated revision was appended")
	}
	if events[len(events)-1] == "done b <nil>" {
		t.Fatalf("events %q: b was told it is durable", events)
	}
}

// An entry has one encoding: version 2 exactly when it carries a change.
func TestEntryVersionFollowsTheChange(t *testing.T) {
	digest := audit.PayloadDigest([]byte("p"))
	for _, tc := range []struct {
		data string
		ok   bool
	}{
		{`{"change":{"digest":"` + digest + `","revision":7},"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":2}`, true},
		{`{"change":{"digest":"` + digest + `","revision":7},"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":1}`, false},
		{`{"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":2}`, false},
		{`{"change":{"digest":"sha256:00","revision":7},"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":2}`, false},
		{`{"change":{"revision":7,"digest":"` + digest + `"},"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":2}`, false},
		{`{"kind":"state_change","time":"2026-12-01T09:00:00.000000000Z","v":3}`, false},
	} {
		e, err := audit.DecodeEntry([]byte(tc.data))
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.data, err, tc.ok)
			continue
		}
		if err == nil {
			if b, _ := e.Encode(); string(b) != tc.data {
				t.Errorf("%s re-encodes as %s", tc.data, b)
			}
		}
	}
}

// A log written before proposals (no changes or snapshots bucket) opens
// read-only, as an export of it does, and holds no changes.
func TestLogBeforeProposalsOpensReadOnly(t *testing.T) {
	l, path := newLog(t)
	appendN(t, l, 0, 3)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"changes", "snapshots"} {
		if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte(b)) }); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	ro, err := audit.Open(path, audit.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	n := 0
	if err := ro.Changes(context.Background(), 0, func(uint64, uint64, []byte) error { n++; return nil }); err != nil || n != 0 {
		t.Fatalf("changes of an older log: %d, %v", n, err)
	}
	if last, err := ro.LastChange(); err != nil || last != 0 {
		t.Fatalf("LastChange %d, %v", last, err)
	}
	if found, err := ro.Snapshot(func(uint64, uint64, []byte) error { return nil }); err != nil || found {
		t.Fatalf("Snapshot %v, %v", found, err)
	}
}

// A payload edited in the file (the changes sit beside the tree, not in
// it) is refused where it is read: its entry's digest no longer matches,
// so a replay cannot be fed a change the signed log does not record.
func TestTamperedPayloadRefused(t *testing.T) {
	l, path := newLog(t)
	var mu sync.Mutex
	var events []string
	if _, err := l.Propose(context.Background(), recorder{mu: &mu, events: &events, name: "a", rev: 1, entries: 1}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("changes"))
		k, v := b.Cursor().First()
		v = append([]byte(nil), v...)
		v[len(v)-1] ^= 1
		return b.Put(k, v)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	l2 := openLog(t, path, testSigner(t, "key-v1", 1))
	defer l2.Close()
	err = l2.Changes(context.Background(), 0, func(uint64, uint64, []byte) error { return nil })
	if !errors.Is(err, audit.ErrCorrupt) || !strings.Contains(err.Error(), "not the one entry") {
		t.Fatalf("Changes over a tampered payload = %v, want ErrCorrupt", err)
	}
}

// Append refuses an entry that claims a change: only a proposal, whose
// payload sits beside it, records one.
func TestAppendRefusesAChange(t *testing.T) {
	l, _ := newLog(t)
	e := sampleEntry(1)
	e.Change = &audit.ChangeRef{Revision: 1, Digest: audit.PayloadDigest(nil)}
	if _, _, err := l.Append(context.Background(), e); !errors.Is(err, audit.ErrInvalidEntry) {
		t.Fatalf("Append with a change = %v, want ErrInvalidEntry", err)
	}
}

// Changes answers the same from memory (the changes this copy just
// stored) as from the file, checked, after a reopen.
func TestChangesFromMemoryEqualTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	l, err := audit.Open(path, audit.Options{Origin: "nvmegate.test/recent"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	for i := range 50 {
		p := recorder{mu: &mu, events: &events, name: fmt.Sprint(i), rev: uint64(i + 1), entries: 1 + i%2}
		if _, err := l.Propose(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	read := func(l *audit.Log, from uint64) []string {
		var out []string
		if err := l.Changes(context.Background(), from, func(rev, index uint64, payload []byte) error {
			out = append(out, fmt.Sprintf("%d@%d=%s", rev, index, payload))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	mem0, mem40 := read(l, 0), read(l, 40)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = audit.Open(path, audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if file := read(l, 0); len(mem0) != 50 || !slices.Equal(mem0, file) {
		t.Fatalf("from memory %v\nfrom the file %v", mem0, file)
	}
	if file := read(l, 40); len(mem40) != 10 || !slices.Equal(mem40, file) {
		t.Fatalf("after 40, from memory %v, from the file %v", mem40, file)
	}
}
