package store_test

import (
	"path/filepath"
	"testing"

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
