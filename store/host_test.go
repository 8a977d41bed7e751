package store

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate"
	bolt "go.etcd.io/bbolt"
)

func TestHostBindingRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)

	in := newBinding(1, "acme")
	must(t, db.CreateHostBinding(ctx, in))
	created := in.CreatedAt
	checkCreatedAt(t, &in.CreatedAt)

	for name, get := range map[string]func() (*nvmegate.HostBinding, error){
		"HostBinding":      func() (*nvmegate.HostBinding, error) { return db.HostBinding(ctx, nodeID(1)) },
		"HostBindingByNQN": func() (*nvmegate.HostBinding, error) { return db.HostBindingByNQN(ctx, hostNQN(1)) },
	} {
		got, err := get()
		must(t, err)
		if !got.CreatedAt.Equal(created) {
			t.Errorf("%s: CreatedAt = %v, want %v", name, got.CreatedAt, created)
		}
		checkCreatedAt(t, &got.CreatedAt)
		if !reflect.DeepEqual(got, in) {
			t.Errorf("%s = %+v\nwant %+v", name, got, in)
		}
	}

	must(t, db.DeleteHostBinding(ctx, nodeID(1)))
	_, err := db.HostBinding(ctx, nodeID(1))
	wantMessage(t, wantError(t, err, nvmegate.ENOTFOUND, ""), nodeID(1))
	_, err = db.HostBindingByNQN(ctx, hostNQN(1))
	wantMessage(t, wantError(t, err, nvmegate.ENOTFOUND, ""), hostNQN(1))
	wantError(t, db.DeleteHostBinding(ctx, nodeID(1)), nvmegate.ENOTFOUND, "")
}

func TestCreateHostBindingRules(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateHostBinding(ctx, newBinding(1, "")))

	// Own validation, unchanged.
	bad := newBinding(2, "")
	bad.SPIFFEID = "https://example.org/node/n2"
	err := db.CreateHostBinding(ctx, bad)
	wantError(t, err, nvmegate.EINVALID, "spiffe_id")
	if !reflect.DeepEqual(err, bad.Validate()) {
		t.Errorf("error %#v is not Validate's", err)
	}

	// The same identity twice, even with another NQN.
	dup := newBinding(1, "")
	dup.HostNQN = hostNQN(2)
	wantMessage(t, wantError(t, db.CreateHostBinding(ctx, dup), nvmegate.EEXISTS, ""),
		`host binding for "`+nodeID(1)+`" already exists`)

	// Another identity asking for node 1's NQN: refused, without naming node 1.
	steal := newBinding(2, "")
	steal.HostNQN = hostNQN(1)
	err = db.CreateHostBinding(ctx, steal)
	e := wantError(t, err, nvmegate.ECONFLICT, "")
	wantMessage(t, e, hostNQN(1), "bound to another identity")
	if strings.Contains(e.Message, nodeID(1)) {
		t.Errorf("error names the other identity: %q", e.Message)
	}
	if _, err := db.HostBinding(ctx, nodeID(2)); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Errorf("refused binding was stored: %v", err)
	}
	if !steal.CreatedAt.IsZero() {
		t.Errorf("CreatedAt set on a failed create")
	}

	// Once node 1's binding is gone, its NQN is free.
	must(t, db.DeleteHostBinding(ctx, nodeID(1)))
	must(t, db.CreateHostBinding(ctx, steal))
	got, err := db.HostBindingByNQN(ctx, hostNQN(1))
	must(t, err)
	if got.SPIFFEID != nodeID(2) {
		t.Errorf("HostBindingByNQN = %s, want %s", got.SPIFFEID, nodeID(2))
	}
}

func TestListHostBindingsFilter(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	var all, acme []string
	for i := range 20 {
		tenant := ""
		if i%3 == 0 {
			tenant = "acme"
		}
		must(t, db.CreateHostBinding(ctx, newBinding(i, tenant)))
		all = append(all, nodeID(i))
		if tenant == "acme" {
			acme = append(acme, nodeID(i))
		}
	}
	for f, want := range map[HostBindingFilter][]string{{}: all, {Tenant: "acme"}: acme, {Tenant: "globex"}: nil} {
		got := collect(t, func(p Page) ([]*nvmegate.HostBinding, string, error) { return db.ListHostBindings(ctx, f, p) }, 3)
		var ids []string
		for _, h := range got {
			ids = append(ids, h.SPIFFEID)
		}
		if !reflect.DeepEqual(ids, want) {
			t.Errorf("ListHostBindings(%+v) = %v\nwant %v", f, ids, want)
		}
	}
}

// TestHostBindingByNQNTamperedIndex points node 1's NQN at node 2's binding
// behind the store's back: the lookup must fail, not hand out node 2.
func TestHostBindingByNQNTamperedIndex(t *testing.T) {
	ctx := context.Background()
	db := openPath(t, t.TempDir()+"/store.db")
	defer db.Close()
	must(t, db.CreateHostBinding(ctx, newBinding(1, "")))
	must(t, db.CreateHostBinding(ctx, newBinding(2, "")))
	tamper(t, db, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketHostBindingsByNQN).Put([]byte(hostNQN(1)), []byte(nodeID(2)))
	})
	if err := checkInvariants(db); err == nil {
		t.Error("invariant checker missed the tampered index")
	}

	h, err := db.HostBindingByNQN(ctx, hostNQN(1))
	if err == nil || nvmegate.ErrorCode(err) != nvmegate.EINTERNAL {
		t.Fatalf("HostBindingByNQN = %v, %v; want an internal error", h, err)
	}
	wantMessage(t, err, "index")
	if h != nil {
		t.Errorf("returned a binding with the error: %+v", h)
	}
	// Deleting node 1 must not remove node 2's index entry.
	if err := db.DeleteHostBinding(ctx, nodeID(1)); nvmegate.ErrorCode(err) != nvmegate.EINTERNAL {
		t.Errorf("DeleteHostBinding over a tampered index = %v, want an internal error", err)
	}
}
