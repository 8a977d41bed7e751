package localstore_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/keystest"
	"github.com/nvmegate/nvmegate/keys/localstore"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	keystest.Run(t, func(t *testing.T) keys.Backend {
		s, err := localstore.Open(filepath.Join(dir, "keys.db"), filepath.Join(dir, "keys.key"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// The key file is created 0600; a readable or wrong-sized one is refused;
// the database does not open under another key file.
func TestKeyFile(t *testing.T) {
	dir := t.TempDir()
	db, kf := filepath.Join(dir, "keys.db"), filepath.Join(dir, "k")
	s, err := localstore.Open(db, kf)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(kf); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v", fi.Mode(), err)
	}
	ctx := t.Context()
	root := []byte("0123456789abcdef0123456789abcdef")
	if _, err := s.AddRoot(ctx, "nqn.2026-01.io.x:a", 0, root, t0(), t0()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	raw, err := os.ReadFile(db)
	if err != nil || len(raw) == 0 {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), string(root)) || strings.Contains(string(raw), base64.StdEncoding.EncodeToString(root)) {
		t.Fatal("the root is readable in the database file")
	}
	os.Chmod(kf, 0o644)
	if _, err := localstore.Open(db, kf); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("readable key file: %v", err)
	}
	other := filepath.Join(dir, "other")
	s, err = localstore.Open(db, other)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Roots(ctx, "nqn.2026-01.io.x:a"); err == nil || !strings.Contains(err.Error(), "does not unseal") {
		t.Fatalf("another key file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "short"), []byte("x"), 0o600)
	if _, err := localstore.Open(filepath.Join(dir, "b.db"), filepath.Join(dir, "short")); err == nil {
		t.Fatal("short key file accepted")
	}
	os.WriteFile(filepath.Join(dir, "long"), make([]byte, 33), 0o600)
	if _, err := localstore.Open(filepath.Join(dir, "c.db"), filepath.Join(dir, "long")); err == nil {
		t.Fatal("long key file accepted")
	}
	// A symlink is not followed to a key file elsewhere.
	os.Symlink(other, filepath.Join(dir, "link"))
	if _, err := localstore.Open(filepath.Join(dir, "d.db"), filepath.Join(dir, "link")); err == nil {
		t.Fatal("a symlinked key file was followed")
	}
	// No temporary files are left beside a created key.
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".keyfile-*")); len(tmp) != 0 {
		t.Fatalf("left behind: %v", tmp)
	}
}
