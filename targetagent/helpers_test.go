package targetagent_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/store"
)

// oneTarget opens a store and a key manager over a local key store in a
// temporary directory, closed when the test ends, with target t1 and its
// subsystem sub (one TCP port, DH-HMAC-CHAP) in the store.
func oneTarget(t *testing.T, opts keys.Options) (*store.DB, *localstore.Store, *keys.Manager, *nvmegate.Target) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "s.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ks, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	opts.Backend = ks
	km, err := keys.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	tgt := &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverNVMet, Ports: []nvmegate.Port{
		{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"}}}
	if err := db.CreateTarget(ctx, tgt); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}); err != nil {
		t.Fatal(err)
	}
	return db, ks, km, tgt
}
