package audit_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

func TestAppendAndProofs(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	var leaves [][32]byte
	var cps []audit.Checkpoint
	for _, n := range []int{1, 6, 250, 300, 1, 600} { // crosses tile boundaries
		for i := 0; i < n; i++ {
			idx, leaf, err := l.Append(ctx, sampleEntry(len(leaves)))
			if err != nil {
				t.Fatal(err)
			}
			if idx != uint64(len(leaves)) {
				t.Fatalf("index %d, want %d", idx, len(leaves))
			}
			leaves = append(leaves, leaf)
		}
		cp, err := l.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cp.Size != uint64(len(leaves)) {
			t.Fatalf("checkpoint size %d, want %d", cp.Size, len(leaves))
		}
		cps = append(cps, cp)
	}
	h := rfc6962.DefaultHasher
	for _, cp := range cps {
		root, err := l.RootAt(ctx, cp.Size)
		if err != nil || root != cp.Hash {
			t.Fatalf("RootAt(%d) = %x, %v; checkpoint %x", cp.Size, root, err, cp.Hash)
		}
		for _, i := range []uint64{0, cp.Size / 3, cp.Size / 2, cp.Size - 1} {
			p, err := l.InclusionProof(ctx, i, cp.Size)
			if err != nil {
				t.Fatal(err)
			}
			if err := proof.VerifyInclusion(h, i, cp.Size, leaves[i][:], p, cp.Hash[:]); err != nil {
				t.Fatalf("inclusion %d in %d: %v", i, cp.Size, err)
			}
		}
	}
	for i := range cps {
		for j := i; j < len(cps); j++ {
			p, err := l.ConsistencyProof(ctx, cps[i].Size, cps[j].Size)
			if err != nil {
				t.Fatal(err)
			}
			if err := proof.VerifyConsistency(h, cps[i].Size, cps[j].Size, p, cps[i].Hash[:], cps[j].Hash[:]); err != nil {
				t.Fatalf("consistency %d→%d: %v", cps[i].Size, cps[j].Size, err)
			}
		}
	}
	if _, err := l.InclusionProof(ctx, 5, uint64(len(leaves))+1); !errors.Is(err, audit.ErrTreeSize) {
		t.Fatalf("proof beyond tree: %v", err)
	}
	// The stored leaf hash is the entry's RFC 6962 leaf hash.
	recs, _, err := l.Query(ctx, audit.Filter{}, audit.Page{Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.LeafHash != leaves[r.Index] || audit.LeafHash(r.Raw) != leaves[r.Index] {
			t.Fatalf("leaf hash of %d", r.Index)
		}
	}
}

func TestReopenKeepsState(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.db")
	s := testSigner(t, "k", 1)
	l := openLog(t, path, s)
	appendN(t, l, 0, 700)
	cp1, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 700, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Append(ctx, sampleEntry(1)); !errors.Is(err, audit.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	l = openLog(t, path, s)
	defer l.Close()
	if l.Size() != 710 {
		t.Fatalf("size after reopen %d", l.Size())
	}
	got, err := l.LatestCheckpoint()
	if err != nil || string(got.Note) != string(cp1.Note) {
		t.Fatalf("latest checkpoint after reopen: %v", err)
	}
	cp2, err := l.Checkpoint(ctx)
	if err != nil || cp2.Size != 710 {
		t.Fatalf("checkpoint after reopen: %+v %v", cp2, err)
	}
	// A different origin is refused.
	l.Close()
	if _, err := audit.Open(path, audit.Options{Origin: "other.example/log"}); err == nil {
		t.Fatal("opened with another origin")
	}
}

func TestCheckpointNote(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	appendN(t, l, 0, 3)
	cp, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A standard C2SP note verifier (x/mod) accepts it with the exported
	// verifier key.
	pub := testSigner(t, "key-v1", 1).PublicKey()
	vkey, err := pub.VerifierKey(testOrigin)
	if err != nil {
		t.Fatal(err)
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		t.Fatal(err)
	}
	n, err := note.Open(cp.Note, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	want := testOrigin + "\n3\n" + b64(cp.Hash[:]) + "\n"
	if n.Text != want {
		t.Fatalf("body %q, want %q", n.Text, want)
	}
	got, signers, err := audit.OpenCheckpoint(cp.Note, []attest.PublicKey{pub})
	if err != nil || got.Size != 3 || len(signers) != 1 || signers[0].Version != 1 {
		t.Fatalf("OpenCheckpoint: %+v %v %v", got, signers, err)
	}
	// No growth, no new checkpoint.
	again, err := l.Checkpoint(ctx)
	if err != nil || string(again.Note) != string(cp.Note) {
		t.Fatalf("checkpoint without growth re-signed: %v", err)
	}
}

func TestCheckpointECDSA(t *testing.T) {
	ctx := context.Background()
	key, err := attest.GenerateKey(attest.ECDSAP256, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewLocalSigner(key, 7)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.db")
	l := openLog(t, path, s)
	defer l.Close()
	appendN(t, l, 0, 5)
	cp, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, signers, err := audit.OpenCheckpoint(cp.Note, []attest.PublicKey{s.PublicKey()}); err != nil || signers[0].Version != 7 {
		t.Fatalf("ECDSA checkpoint: %v", err)
	}
	keys, err := l.SigningKeys()
	if err != nil || len(keys) != 1 || !keys[0].Equal(s.PublicKey()) || keys[0].Version != 7 {
		t.Fatalf("signing keys %v %v", keys, err)
	}
}

func TestKeyRotationExportsEveryVersion(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	kd, err := attest.OpenKeyDir(filepath.Join(dir, "keys"), attest.Ed25519, true)
	if err != nil {
		t.Fatal(err)
	}
	l := openLog(t, filepath.Join(dir, "audit.db"), kd)
	defer l.Close()
	appendN(t, l, 0, 10)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := kd.Rotate(nil); err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 10, 10)
	cp, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "export")
	if _, err := l.Export(ctx, out, 0); err != nil {
		t.Fatal(err)
	}
	exported, err := attest.LoadPublicKeyDir(filepath.Join(out, "keys"))
	if err != nil || len(exported) != 2 || exported[0].Version != 1 || exported[1].Version != 2 {
		t.Fatalf("exported keys %v %v", exported, err)
	}
	// The auditor trusts both versions: the old checkpoint (v1) and the
	// new one (v2) verify.
	r, err := audit.Verify(ctx, out, kd.PublicKeys(), nil, nil)
	if err != nil || !r.OK() {
		t.Fatalf("verify: %v %v", err, r.Failures)
	}
	if r.Checkpoints != 1 || r.SignedBy[0].Version != 2 || r.TreeSize != cp.Size {
		t.Fatalf("report %+v", r)
	}
}

func TestConcurrentAppends(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	const workers, per = 64, 50
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				idx, _, err := l.Append(ctx, sampleEntry(w*per+i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seen[idx] {
					t.Errorf("index %d twice", idx)
				}
				seen[idx] = true
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	if l.Size() != workers*per || len(seen) != workers*per {
		t.Fatalf("size %d, distinct %d", l.Size(), len(seen))
	}
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestAppendRefusesKeyMaterialAndInvalid(t *testing.T) {
	ctx := context.Background()
	l, _ := newLog(t)
	secrets := []string{
		"DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:",
		"NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:",
		"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEI...",
		"reason: dhhc-1:00:lowercase-too",
	}
	for _, s := range secrets {
		for _, set := range []func(*audit.Entry){
			func(e *audit.Entry) { e.Detail = s },
			func(e *audit.Entry) { e.Decision.Reasons = append(e.Decision.Reasons, s) },
			func(e *audit.Entry) { e.Keys[0].Fingerprint = s },
		} {
			e := sampleEntry(1)
			set(&e)
			_, _, err := l.Append(ctx, e)
			if !errors.Is(err, audit.ErrKeyMaterial) {
				t.Fatalf("secret accepted: %v", err)
			}
			if containsAny(err.Error(), "DHHC", "NVMeTLS", "BEGIN", "dhhc") {
				t.Fatalf("error echoes the secret: %v", err)
			}
		}
	}
	for name, set := range map[string]func(*audit.Entry){
		"kind":     func(e *audit.Entry) { e.Kind = "grnat" },
		"control":  func(e *audit.Entry) { e.JobID = "job\x00x" },
		"utf8":     func(e *audit.Entry) { e.Detail = "bad \xff" },
		"too long": func(e *audit.Entry) { e.Detail = string(make([]byte, 5000)) },
	} {
		e := sampleEntry(1)
		set(&e)
		if _, _, err := l.Append(ctx, e); !errors.Is(err, audit.ErrInvalidEntry) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if l.Size() != 0 {
		t.Fatalf("refused entries were written: size %d", l.Size())
	}
}

func TestCheckpointerRun(t *testing.T) {
	l, _ := newLog(t)
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(context.Background())
	c := &audit.Checkpointer{Log: l, Tick: tick}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	appendN(t, l, 0, 5)
	tick <- time.Time{}
	tick <- time.Time{} // the first tick has been handled once the second is taken
	cp, err := l.LatestCheckpoint()
	if err != nil || cp.Size != 5 {
		t.Fatalf("after tick: %+v %v", cp, err)
	}
	appendN(t, l, 5, 3)
	cancel() // shutdown signs the rest
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cp, _ := l.LatestCheckpoint(); cp.Size != 8 {
		t.Fatalf("shutdown checkpoint size %d", cp.Size)
	}
}

func TestCheckpointRefusesFork(t *testing.T) {
	// A log whose stored checkpoint disagrees with its tree refuses to sign.
	ctx := context.Background()
	dir := t.TempDir()
	a := openLog(t, filepath.Join(dir, "a.db"), testSigner(t, "k", 1))
	defer a.Close()
	appendN(t, a, 0, 10)
	cpA, _ := a.Checkpoint(ctx)

	path := filepath.Join(dir, "b.db")
	b := openLog(t, path, testSigner(t, "k", 1))
	appendN(t, b, 100, 10) // different entries, same size
	b.Close()
	injectCheckpoint(t, path, cpA) // the stored "previous" checkpoint is a's
	b = openLog(t, path, testSigner(t, "k", 1))
	defer b.Close()
	appendN(t, b, 200, 1)
	_, err := b.Checkpoint(ctx)
	var inc *audit.InconsistentError
	if !errors.As(err, &inc) || !errors.Is(err, audit.ErrCorrupt) || inc.OldSize != 10 || inc.NewSize != 11 {
		t.Fatalf("signed over a fork: %v", err)
	}
}
