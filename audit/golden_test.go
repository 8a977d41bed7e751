package audit_test

import (
	"bytes"
	"context"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

var update = flag.Bool("update", false, "rewrite testdata/golden-export")

// goldenDir is a C2SP tlog-tiles export made with a fixed key (seed
// SHA-256("golden-v1")), a fixed clock and fixed entries, so every byte is
// reproducible. Regenerate it after an intended format change with
//
//	go test ./audit -run TestGoldenExport -update
const goldenDir = "testdata/golden-export"

func makeGolden(t *testing.T, out string) {
	t.Helper()
	ctx := context.Background()
	l := openLog(t, filepath.Join(t.TempDir(), "audit.db"), testSigner(t, "golden-v1", 1))
	defer l.Close()
	appendN(t, l, 0, 10)
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 10, 288)
	// Two entries of schema version 2: a proposal's, committing to its
	// change's payload.
	var mu sync.Mutex
	var events []string
	if _, err := l.Propose(ctx, recorder{mu: &mu, events: &events, name: "golden", rev: 1, entries: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Export(ctx, out, 0); err != nil {
		t.Fatal(err)
	}
}

func readTree(t *testing.T, root string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		files[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestGoldenExport(t *testing.T) {
	if *update {
		os.RemoveAll(goldenDir)
		makeGolden(t, goldenDir)
	}
	fresh := filepath.Join(t.TempDir(), "export")
	makeGolden(t, fresh)
	want, got := readTree(t, goldenDir), readTree(t, fresh)
	for name, w := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, w) {
			t.Errorf("%s differs from the golden export (format change? regenerate with -update)", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s is new in the export", name)
		}
	}
	keys := []attest.PublicKey{testSigner(t, "golden-v1", 1).PublicKey()}
	r, err := audit.Verify(context.Background(), goldenDir, keys, nil, nil)
	if err != nil || !r.OK() || r.TreeSize != 300 || r.Checkpoints != 1 {
		t.Fatalf("golden export does not verify: %v %+v", err, r)
	}
	// The keys the export carries are the ones that verify it.
	exported, err := attest.LoadPublicKeyDir(filepath.Join(goldenDir, "keys"))
	if err != nil || len(exported) != 1 || !exported[0].Equal(keys[0]) {
		t.Fatalf("exported keys %v %v", exported, err)
	}
}
