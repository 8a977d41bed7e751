package etcdstore_test

import (
	"fmt"
	"path/filepath"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/etcdstore"
	"github.com/nvmegate/nvmegate/store/storetest"
)

// replicaCopy opens a gateway replica's copy of the store under prefix.
func replicaCopy(t *testing.T, cl *clientv3.Client, prefix string) *store.DB {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{Replica: etcdstore.New(cl, prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The conformance suite on three copies of one store replicated on a
// real etcd: each write goes to one copy, reads to the others.
func TestConformance(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	n := 0
	storetest.Run(t, func(t *testing.T) []*store.DB {
		n++
		prefix := fmt.Sprintf("/conformance/%d/", n)
		return []*store.DB{replicaCopy(t, cl, prefix), replicaCopy(t, cl, prefix), replicaCopy(t, cl, prefix)}
	})
}
