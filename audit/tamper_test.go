package audit_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
)

// tamperFixture is a log of 600 entries (bundles of 256, 256 and 88) with
// checkpoints at 100, 300 and 600, exported.
type tamperFixture struct {
	dir    string // the export
	dbPath string // the (closed) log file
	keys   []attest.PublicKey
	cps    []audit.Checkpoint
}

func newTamperFixture(t *testing.T) *tamperFixture {
	t.Helper()
	ctx := context.Background()
	base := t.TempDir()
	f := &tamperFixture{dbPath: filepath.Join(base, "audit.db"), dir: filepath.Join(base, "export")}
	s := testSigner(t, "key-v1", 1)
	f.keys = []attest.PublicKey{s.PublicKey()}
	l := openLog(t, f.dbPath, s)
	for _, upto := range []int{100, 300, 600} {
		appendN(t, l, int(l.Size()), upto-int(l.Size()))
		cp, err := l.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		f.cps = append(f.cps, cp)
	}
	if _, err := l.Export(ctx, f.dir, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return f
}

// copyExport returns a fresh copy of the export to tamper with.
func (f *tamperFixture) copyExport(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "export")
	if err := os.CopyFS(dst, os.DirFS(f.dir)); err != nil {
		t.Fatal(err)
	}
	return dst
}

func (f *tamperFixture) copyDB(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(f.dbPath)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "audit.db")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func readBundle(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for len(data) > 0 {
		n := int(binary.BigEndian.Uint16(data))
		out = append(out, data[2:2+n])
		data = data[2+n:]
	}
	return out
}

func writeBundle(t *testing.T, path string, recs [][]byte) {
	t.Helper()
	var b []byte
	for _, r := range recs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(r)))
		b = append(b, r...)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// expectFailure checks that the report names kind (at index, if ≥ 0) and
// nothing outside allowed.
func expectFailure(t *testing.T, r *audit.Report, kind audit.Kind, index int64, allowed ...audit.Kind) {
	t.Helper()
	if r.OK() {
		t.Fatalf("tampering not detected; want %s", kind)
	}
	ok := map[audit.Kind]bool{kind: true}
	for _, k := range allowed {
		ok[k] = true
	}
	found := false
	for _, f := range r.Failures {
		if !ok[f.Kind] {
			t.Errorf("unexpected failure %v", f)
		}
		if f.Kind == kind && (index < 0 || f.Index != nil && *f.Index == uint64(index)) {
			found = true
		}
	}
	if !found {
		t.Fatalf("want %s at index %d; got %v", kind, index, r.Failures)
	}
	if r.Err() == nil {
		t.Fatal("Err() is nil for a failed report")
	}
}

func verifyDir(t *testing.T, dir string, keys []attest.PublicKey, since []byte) *audit.Report {
	t.Helper()
	r, err := audit.Verify(context.Background(), dir, keys, since, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Logf("finding: %v", f)
	}
	return r
}

func TestVerifyExportTamper(t *testing.T) {
	f := newTamperFixture(t)
	bundle := func(dir string, n uint64, w int) string {
		return filepath.Join(dir, filepath.FromSlash(audit.EntryBundlePath(n, w)))
	}
	otherKey := testSigner(t, "attacker", 1)

	t.Run("intact", func(t *testing.T) {
		var calls int
		var last uint64
		r, err := audit.Verify(context.Background(), f.dir, f.keys, f.cps[1].Note, func(done, total uint64) {
			calls++
			last = done
			if total != 600 {
				t.Errorf("progress total %d", total)
			}
		})
		if err != nil || !r.OK() {
			t.Fatalf("intact export: %v %v", err, r.Failures)
		}
		if r.Entries != 600 || r.TreeSize != 600 || r.Checkpoints != 3 || calls != 3 || last != 600 {
			t.Fatalf("report %+v, progress calls %d last %d", r, calls, last)
		}
	})
	t.Run("modified entry", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 1, 256)
		recs := readBundle(t, p)
		recs[10] = bytes.Replace(recs[10], []byte("job-"), []byte("jab-"), 1)
		writeBundle(t, p, recs)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindModifiedEntry, 256+10)
	})
	t.Run("bytes flipped in bundle", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		data, _ := os.ReadFile(p)
		data[5000] ^= 0x01
		os.WriteFile(p, data, 0o644)
		r := verifyDir(t, d, f.keys, nil)
		// The flipped byte may also make the entry non-canonical.
		expectFailure(t, r, audit.KindModifiedEntry, -1, audit.KindMalformedEntry)
	})
	t.Run("deleted entry", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		recs = append(recs[:40:40], recs[41:]...)
		writeBundle(t, p, recs)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindMissingEntry, 40)
	})
	t.Run("swapped entries", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		recs[3], recs[7] = recs[7], recs[3]
		writeBundle(t, p, recs)
		r := verifyDir(t, d, f.keys, nil)
		expectFailure(t, r, audit.KindReorderedEntry, 3)
		expectFailure(t, r, audit.KindReorderedEntry, 7)
	})
	// An adjacent swap is a reordering, not a deletion: both entries are
	// there, each at the other's index.
	t.Run("adjacent entries swapped", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 1, 256)
		recs := readBundle(t, p)
		recs[20], recs[21] = recs[21], recs[20]
		writeBundle(t, p, recs)
		r := verifyDir(t, d, f.keys, nil)
		expectFailure(t, r, audit.KindReorderedEntry, 256+20)
		expectFailure(t, r, audit.KindReorderedEntry, 256+21)
	})
	t.Run("two entries deleted", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		recs = slices.Delete(recs, 40, 41) // entry 40
		recs = slices.Delete(recs, 50, 51) // entry 51
		writeBundle(t, p, recs)
		r := verifyDir(t, d, f.keys, nil)
		expectFailure(t, r, audit.KindMissingEntry, 40)
		expectFailure(t, r, audit.KindMissingEntry, 51)
		if n := len(r.Failures); n != 2 {
			t.Fatalf("%d findings, want the 2 deletions", n)
		}
	})
	t.Run("entry deleted and others swapped", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		recs[10], recs[11] = recs[11], recs[10]
		recs = slices.Delete(recs, 40, 41)
		// Entries 101 and 102 moved up to 100 and 101; swapped, 101 is
		// back in its place and 102 two places up.
		recs[100], recs[101] = recs[101], recs[100]
		writeBundle(t, p, recs)
		r := verifyDir(t, d, f.keys, nil)
		for _, want := range []struct {
			kind  audit.Kind
			index int64
		}{{audit.KindReorderedEntry, 10}, {audit.KindReorderedEntry, 11}, {audit.KindMissingEntry, 40}, {audit.KindReorderedEntry, 100}} {
			expectFailure(t, r, want.kind, want.index, audit.KindMissingEntry, audit.KindReorderedEntry)
		}
		if n := len(r.Failures); n != 4 {
			t.Fatalf("%d findings, want 4", n)
		}
	})
	t.Run("entry inserted", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		e := sampleEntry(9999)
		data, _ := e.Encode()
		writeBundle(t, p, slices.Insert(recs, 30, data))
		r := verifyDir(t, d, f.keys, nil)
		expectFailure(t, r, audit.KindExtraEntry, 30)
		for _, x := range r.Failures {
			if x.Kind != audit.KindExtraEntry {
				t.Errorf("finding besides the insertion: %v", x)
			}
		}
	})
	// A copy of an entry still in its place is not told from any other
	// change of the bytes.
	t.Run("entry replaced by a copy of another", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 0, 256)
		recs := readBundle(t, p)
		recs[3] = recs[7]
		writeBundle(t, p, recs)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindModifiedEntry, 3)
	})
	// Random tampering inside a bundle names exactly what was done: a swap
	// of two entries (adjacent or not) two reordered entries, a deletion one
	// missing entry, each at its index.
	t.Run("random swaps and deletions", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(14, 3))
		for range 20 {
			d := f.copyExport(t)
			p := bundle(d, 1, 256)
			recs := readBundle(t, p)
			want := map[uint64]audit.Kind{}
			i := 1 + rng.IntN(200)
			if rng.IntN(2) == 0 {
				j := i + 1 + rng.IntN(3)
				recs[i], recs[j] = recs[j], recs[i]
				want[256+uint64(i)], want[256+uint64(j)] = audit.KindReorderedEntry, audit.KindReorderedEntry
			} else {
				recs = slices.Delete(recs, i, i+1)
				want[256+uint64(i)] = audit.KindMissingEntry
			}
			writeBundle(t, p, recs)
			r, err := audit.Verify(context.Background(), d, f.keys, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[uint64]audit.Kind{}
			for _, x := range r.Failures {
				if x.Index == nil {
					t.Fatalf("finding without an index: %v", x)
				}
				got[*x.Index] = x.Kind
			}
			if len(r.Failures) != len(want) || !maps.Equal(got, want) {
				t.Fatalf("want %v, got %v", want, r.Failures)
			}
		}
	})
	t.Run("entry appended to last bundle", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 2, 88)
		recs := readBundle(t, p)
		e := sampleEntry(9999)
		data, _ := e.Encode()
		writeBundle(t, p, append(recs, data))
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindExtraEntry, 600)
	})
	t.Run("bundle appended", func(t *testing.T) {
		d := f.copyExport(t)
		e := sampleEntry(9999)
		data, _ := e.Encode()
		writeBundle(t, bundle(d, 3, 1), [][]byte{data})
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindExtraEntry, -1)
	})
	t.Run("truncated", func(t *testing.T) {
		d := f.copyExport(t)
		os.Remove(bundle(d, 2, 88))
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindTruncated, 512)
	})
	t.Run("truncated inside the last bundle", func(t *testing.T) {
		d := f.copyExport(t)
		p := bundle(d, 2, 88)
		recs := readBundle(t, p)
		os.Remove(p)
		writeBundle(t, bundle(d, 2, 80), recs[:80])
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindTruncated, 592)
	})
	t.Run("missing bundle", func(t *testing.T) {
		d := f.copyExport(t)
		os.Remove(bundle(d, 1, 256))
		r := verifyDir(t, d, f.keys, nil)
		expectFailure(t, r, audit.KindMissingTile, 256)
		if len(r.Failures) != 1 {
			t.Fatalf("%d findings, want the missing bundle once", len(r.Failures))
		}
	})
	t.Run("missing hash tile", func(t *testing.T) {
		d := f.copyExport(t)
		os.Remove(filepath.Join(d, filepath.FromSlash(audit.HashTilePath(0, 1, 256))))
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindMissingTile, -1)
	})
	t.Run("modified hash tile", func(t *testing.T) {
		d := f.copyExport(t)
		p := filepath.Join(d, filepath.FromSlash(audit.HashTilePath(0, 0, 256)))
		data, _ := os.ReadFile(p)
		data[100] ^= 0xff
		os.WriteFile(p, data, 0o644)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindTileMismatch, -1)
	})
	t.Run("modified level-1 tile", func(t *testing.T) {
		d := f.copyExport(t)
		p := filepath.Join(d, filepath.FromSlash(audit.HashTilePath(1, 0, 2)))
		data, _ := os.ReadFile(p)
		data[0] ^= 0xff
		os.WriteFile(p, data, 0o644)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindTileMismatch, -1)
	})
	t.Run("checkpoint replaced by an older one", func(t *testing.T) {
		d := f.copyExport(t)
		os.WriteFile(filepath.Join(d, "checkpoint"), f.cps[1].Note, 0o644)
		// The export's own history and the auditor's saved checkpoint
		// both show the rollback; the entries past 300 are unsigned.
		r := verifyDir(t, d, f.keys, f.cps[2].Note)
		// (The export's partial tiles are those of size 600, so the ones
		// of size 300 are missing too.)
		expectFailure(t, r, audit.KindRollback, -1, audit.KindExtraEntry, audit.KindMissingTile)
		found := false
		for _, x := range r.Failures {
			found = found || x.Kind == audit.KindRollback && x.Location == "since"
		}
		if !found {
			t.Fatal("rollback against since not named")
		}
	})
	t.Run("forged checkpoint", func(t *testing.T) {
		d := f.copyExport(t)
		// An attacker signs their own checkpoint of a rewritten log.
		forged := fmt.Sprintf("%s\n600\n%s\n", testOrigin, b64(make([]byte, 32)))
		ns, _ := attest.NoteSigner(context.Background(), otherKey, testOrigin)
		msg, _ := note.Sign(&note.Note{Text: forged}, ns)
		os.WriteFile(filepath.Join(d, "checkpoint"), msg, 0o644)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindUnknownKey, -1, audit.KindRootMismatch)
	})
	t.Run("checkpoint body altered", func(t *testing.T) {
		d := f.copyExport(t)
		msg := bytes.Replace(f.cps[2].Note, []byte("\n600\n"), []byte("\n599\n"), 1)
		os.WriteFile(filepath.Join(d, "checkpoint"), msg, 0o644)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindBadSignature, -1,
			audit.KindRootMismatch, audit.KindExtraEntry, audit.KindTileMismatch, audit.KindMissingTile, audit.KindMissingEntry, audit.KindModifiedEntry, audit.KindTruncated)
	})
	t.Run("unknown key", func(t *testing.T) {
		r := verifyDir(t, f.dir, []attest.PublicKey{otherKey.PublicKey()}, nil)
		expectFailure(t, r, audit.KindUnknownKey, -1)
	})
	t.Run("fork against an earlier checkpoint", func(t *testing.T) {
		// Another log under the same name and key, with other entries: its
		// checkpoint of size 300 is inconsistent with this log.
		ctx := context.Background()
		l := openLog(t, filepath.Join(t.TempDir(), "fork.db"), testSigner(t, "key-v1", 1))
		defer l.Close()
		appendN(t, l, 1000, 300)
		cp, err := l.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		expectFailure(t, verifyDir(t, f.dir, f.keys, cp.Note), audit.KindInconsistent, -1)
	})
	t.Run("history checkpoint forked", func(t *testing.T) {
		d := f.copyExport(t)
		l := openLog(t, filepath.Join(t.TempDir(), "fork.db"), testSigner(t, "key-v1", 1))
		defer l.Close()
		appendN(t, l, 1000, 100)
		cp, _ := l.Checkpoint(context.Background())
		os.WriteFile(filepath.Join(d, "checkpoints", "100"), cp.Note, 0o644)
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindInconsistent, -1)
	})
	t.Run("missing checkpoint", func(t *testing.T) {
		d := f.copyExport(t)
		os.Remove(filepath.Join(d, "checkpoint"))
		expectFailure(t, verifyDir(t, d, f.keys, nil), audit.KindMissingCheckpoint, -1)
	})
}

// modifyDB runs fn on the closed log file with plain bbolt, as someone with
// write access to the file could.
func modifyDB(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// chunks returns the entry chunk keys and records of the file.
func chunkRecords(v []byte) [][]byte {
	var out [][]byte
	for len(v) > 0 {
		n := int(binary.BigEndian.Uint16(v))
		out = append(out, append([]byte(nil), v[2:2+n]...))
		v = v[2+n:]
	}
	return out
}

func encodeChunk(recs [][]byte) []byte {
	var b []byte
	for _, r := range recs {
		b = binary.BigEndian.AppendUint16(b, uint16(len(r)))
		b = append(b, r...)
	}
	return b
}

// editChunk rewrites the chunk that holds entry index.
func editChunk(t *testing.T, path string, index uint64, fn func(first uint64, recs [][]byte) [][]byte) {
	modifyDB(t, path, func(tx *bolt.Tx) error {
		entries := tx.Bucket([]byte("entries"))
		c := entries.Cursor()
		k, _ := c.Seek(binary.BigEndian.AppendUint64(nil, index))
		if k == nil || binary.BigEndian.Uint64(k) > index {
			k, _ = c.Prev()
		}
		b := entries.Bucket(k)
		recs := chunkRecords(b.Get([]byte("d")))
		return b.Put([]byte("d"), encodeChunk(fn(binary.BigEndian.Uint64(k), recs)))
	})
}

func checkFile(t *testing.T, path string, keys []attest.PublicKey, since []byte) *audit.Report {
	t.Helper()
	r, err := audit.CheckFile(context.Background(), path, keys, since, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range r.Failures {
		t.Logf("finding: %v", f)
	}
	return r
}

func TestCheckFileTamper(t *testing.T) {
	f := newTamperFixture(t)
	t.Run("intact", func(t *testing.T) {
		r := checkFile(t, f.dbPath, f.keys, f.cps[0].Note)
		if !r.OK() || r.Entries != 600 {
			t.Fatalf("intact file: %+v", r)
		}
	})
	t.Run("bytes changed in the file", func(t *testing.T) {
		p := f.copyDB(t)
		data, _ := os.ReadFile(p)
		i := bytes.Index(data, []byte(`"dec-00000005"`))
		if i < 0 || bytes.Count(data, []byte(`"dec-00000005"`)) != 1 {
			t.Fatal("entry 5 not found once in the file")
		}
		data[i+5] = 'X'
		os.WriteFile(p, data, 0o600)
		expectFailure(t, checkFile(t, p, f.keys, nil), audit.KindModifiedEntry, 5)
		// The log refuses nothing on open (the tree state is intact) but
		// its proofs no longer match the entry; Check names it.
	})
	t.Run("tile bytes changed", func(t *testing.T) {
		p := f.copyDB(t)
		modifyDB(t, p, func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("tiles"))
			k := append([]byte{0}, binary.BigEndian.AppendUint64(nil, 1)...)
			v := append([]byte(nil), b.Get(k)...)
			v[64] ^= 1
			return b.Put(k, v)
		})
		expectFailure(t, checkFile(t, p, f.keys, nil), audit.KindTileMismatch, -1)
	})
	t.Run("entry deleted", func(t *testing.T) {
		p := f.copyDB(t)
		editChunk(t, p, 150, func(first uint64, recs [][]byte) [][]byte {
			j := 150 - first
			return append(recs[:j:j], recs[j+1:]...)
		})
		expectFailure(t, checkFile(t, p, f.keys, nil), audit.KindMissingEntry, 150)
		if _, err := audit.Open(p, audit.Options{}); err != nil && !strings.Contains(err.Error(), "corrupt") {
			t.Logf("open: %v", err)
		}
	})
	t.Run("entries swapped", func(t *testing.T) {
		p := f.copyDB(t)
		var a, b []byte
		editChunk(t, p, 20, func(first uint64, recs [][]byte) [][]byte { a = recs[20-first]; return recs })
		editChunk(t, p, 22, func(first uint64, recs [][]byte) [][]byte { b = recs[22-first]; recs[22-first] = a; return recs })
		editChunk(t, p, 20, func(first uint64, recs [][]byte) [][]byte { recs[20-first] = b; return recs })
		r := checkFile(t, p, f.keys, nil)
		expectFailure(t, r, audit.KindReorderedEntry, 20)
		expectFailure(t, r, audit.KindReorderedEntry, 22)
	})
	t.Run("adjacent entries swapped", func(t *testing.T) {
		p := f.copyDB(t)
		var a, b []byte
		editChunk(t, p, 150, func(first uint64, recs [][]byte) [][]byte { a = recs[150-first]; return recs })
		editChunk(t, p, 151, func(first uint64, recs [][]byte) [][]byte { b = recs[151-first]; recs[151-first] = a; return recs })
		editChunk(t, p, 150, func(first uint64, recs [][]byte) [][]byte { recs[150-first] = b; return recs })
		r := checkFile(t, p, f.keys, nil)
		expectFailure(t, r, audit.KindReorderedEntry, 150)
		expectFailure(t, r, audit.KindReorderedEntry, 151)
	})
	t.Run("entry appended by hand", func(t *testing.T) {
		p := f.copyDB(t)
		modifyDB(t, p, func(tx *bolt.Tx) error {
			e := sampleEntry(777)
			data, _ := e.Encode()
			b, err := tx.Bucket([]byte("entries")).CreateBucket(binary.BigEndian.AppendUint64(nil, 600))
			if err != nil {
				return err
			}
			return b.Put([]byte("d"), encodeChunk([][]byte{data}))
		})
		expectFailure(t, checkFile(t, p, f.keys, nil), audit.KindExtraEntry, -1)
		// The log itself refuses to open over it (fail closed).
		if _, err := audit.Open(p, audit.Options{}); err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Fatalf("open over appended entry: %v", err)
		}
	})
	t.Run("latest checkpoint replaced by an older one", func(t *testing.T) {
		p := f.copyDB(t)
		modifyDB(t, p, func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("checkpoints")).Delete(binary.BigEndian.AppendUint64(nil, 600))
		})
		r := checkFile(t, p, f.keys, f.cps[2].Note)
		expectFailure(t, r, audit.KindRollback, -1)
	})
	t.Run("forged checkpoint", func(t *testing.T) {
		p := f.copyDB(t)
		other := testSigner(t, "attacker", 1)
		ns, _ := attest.NoteSigner(context.Background(), other, testOrigin)
		msg, _ := note.Sign(&note.Note{Text: fmt.Sprintf("%s\n600\n%s\n", testOrigin, b64(f.cps[2].Hash[:]))}, ns)
		modifyDB(t, p, func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("checkpoints")).Put(binary.BigEndian.AppendUint64(nil, 600), msg)
		})
		expectFailure(t, checkFile(t, p, f.keys, nil), audit.KindUnknownKey, -1)
	})
}
