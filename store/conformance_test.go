package store_test

import (
	"path/filepath"
	"testing"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/storetest"
)

// The conformance suite on the single-file store (one copy: every write
// and read goes to it).
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) []*store.DB {
		db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return []*store.DB{db}
	})
}

// The conformance suite on a journaled store: every write a proposal
// sequenced by a real audit log, the file a checkpointed projection.
func TestConformanceJournaled(t *testing.T) {
	storetest.Run(t, func(t *testing.T) []*store.DB {
		dir := t.TempDir()
		log, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/store"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { log.Close() })
		db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return []*store.DB{db}
	})
}
