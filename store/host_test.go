package store

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

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

// A UUID NQN in upper and in lower case, one host.
const (
	upperNQN = "nqn.2014-08.org.nvmexpress:uuid:00000001-BBBB-4000-8000-00000000000A"
	lowerNQN = "nqn.2014-08.org.nvmexpress:uuid:00000001-bbbb-4000-8000-00000000000a"
)

// writeLegacyBinding writes h into the closed store at path as versions
// before canonical host NQNs did: the record as it is (any case), indexed
// under that exact NQN.
func writeLegacyBinding(tb testing.TB, path string, h *nvmegate.HostBinding) {
	tb.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	must(tb, err)
	defer bdb.Close()
	v, err := encodeHostBinding(h)
	must(tb, err)
	must(tb, bdb.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketHostBindings).Put([]byte(h.SPIFFEID), v); err != nil {
			return err
		}
		return tx.Bucket(bucketHostBindingsByNQN).Put([]byte(h.HostNQN), []byte(h.SPIFFEID))
	}))
}

// A binding stored in upper case by an older version is found by its NQN
// in any case, and its NQN cannot be bound to another identity in another
// case; new bindings must be written in lower case.
func TestHostBindingCanonicalNQN(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "store.db")
	must(t, openPath(t, path).Close())
	writeLegacyBinding(t, path, &nvmegate.HostBinding{SPIFFEID: nodeID(1), HostNQN: upperNQN, CreatedAt: t0.UTC()})

	for _, open := range []string{"migrated", "reopened"} {
		db := openPath(t, path)
		for _, nqn := range []string{lowerNQN, upperNQN, "nqn.2014-08.org.nvmexpress:uuid:00000001-bBbB-4000-8000-00000000000A"} {
			h, err := db.HostBindingByNQN(ctx, nqn)
			if err != nil || h.SPIFFEID != nodeID(1) || h.HostNQN != upperNQN {
				t.Fatalf("%s: HostBindingByNQN(%q) = %+v, %v; want node 1's binding as stored", open, nqn, h, err)
			}
		}
		steal := &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: lowerNQN}
		wantMessage(t, wantError(t, db.CreateHostBinding(ctx, steal), nvmegate.ECONFLICT, ""), "bound to another identity")
		steal.HostNQN = upperNQN
		wantMessage(t, wantError(t, db.CreateHostBinding(ctx, steal), nvmegate.EINVALID, "host_nqn"), "lower case", lowerNQN)
		must(t, checkInvariants(db))
		must(t, db.Close())
	}

	db := openPath(t, path)
	defer db.Close()
	must(t, db.DeleteHostBinding(ctx, nodeID(1)))
	must(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: lowerNQN}))
	if h, err := db.HostBindingByNQN(ctx, upperNQN); err != nil || h.SPIFFEID != nodeID(2) {
		t.Fatalf("after the rebinding: %+v, %v", h, err)
	}
	must(t, checkInvariants(db))
}

// An older version could bind one UUID NQN to two identities in two
// letter cases. Open keeps it with the binding created first; the other is
// no lookup's answer, and must be removed before the first can be.
func TestHostBindingLegacySharedNQN(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		upperCreated time.Time
		holder       string // keeps the NQN
	}{
		"lower case first": {t0.Add(24 * time.Hour).UTC(), nodeID(1)},
		"upper case first": {t0.Add(-24 * time.Hour).UTC(), nodeID(2)},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store.db")
			db := openPath(t, path)
			// Node 1's binding, lower case, as an older version stored it too.
			must(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(1), HostNQN: lowerNQN}))
			must(t, db.Close())
			writeLegacyBinding(t, path, &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: upperNQN, CreatedAt: tc.upperCreated})
			sharer := nodeID(1)
			if tc.holder == nodeID(1) {
				sharer = nodeID(2)
			}

			db = openPath(t, path)
			defer db.Close()
			must(t, checkInvariants(db))
			for _, nqn := range []string{lowerNQN, upperNQN} {
				if h, err := db.HostBindingByNQN(ctx, nqn); err != nil || h.SPIFFEID != tc.holder {
					t.Fatalf("HostBindingByNQN(%q) = %+v, %v; want %s's", nqn, h, err, tc.holder)
				}
			}
			// The other's node is granted nothing on it; the holder's is.
			for who, want := range map[string]string{sharer: nvmegate.ECONFLICT, tc.holder: ""} {
				g := newGrant(1, subNQN(0))
				g.ID, g.Node, g.HostNQN = "grant-of-"+who[len(who)-4:], who, upperNQN
				if err := db.PutGrant(ctx, g); nvmegate.ErrorCode(err) != want {
					t.Fatalf("grant of %s: %v, want %q", who, err, want)
				}
				g.State = nvmegate.GrantReleased
				if want == "" {
					must(t, db.PutGrant(ctx, g))
				}
			}
			wantMessage(t, wantError(t, db.DeleteHostBinding(ctx, tc.holder), nvmegate.ECONFLICT, ""), sharer, "remove that binding first")
			must(t, db.DeleteHostBinding(ctx, sharer))
			must(t, checkInvariants(db))
			if h, err := db.HostBindingByNQN(ctx, upperNQN); err != nil || h.SPIFFEID != tc.holder {
				t.Fatalf("after removing the other: %+v, %v", h, err)
			}
			must(t, db.DeleteHostBinding(ctx, tc.holder))
			_, err := db.HostBindingByNQN(ctx, lowerNQN)
			wantError(t, err, nvmegate.ENOTFOUND, "")
			must(t, checkInvariants(db))
		})
	}
}

// A host NQN that active grants of another identity use cannot be bound
// (issue 14: an unbound node's derived NQN, bound to another tenant's
// node, which the target would then take for the first): the refusal names
// the first grant and how many more, and once they end the binding is
// made. The grants' own node may be bound to it; ended grants do not
// count; the comparison is canonical.
func TestCreateHostBindingRefusedWhileGrantsUseNQN(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	// Node 1, unbound, on host NQN 1: two active grants, one ended.
	g1, g2, ended := newGrant(1, subNQN(0)), newGrant(1, subNQN(1)), newGrant(1, subNQN(2))
	g2.ID, ended.ID, ended.State = "grant-0001-b", "grant-0001-c", nvmegate.GrantReleased
	must(t, db.PutGrants(ctx, g1, g2, ended))

	steal := &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: hostNQN(1), Tenant: "globex"}
	e := wantError(t, db.CreateHostBinding(ctx, steal), nvmegate.ECONFLICT, "")
	wantMessage(t, e, hostNQN(1), "active grant grant-0001 and 1 more", "revoke them first")
	if strings.Contains(e.Message, nodeID(1)) {
		t.Errorf("error names the other identity: %q", e.Message)
	}
	if _, err := db.HostBinding(ctx, nodeID(2)); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Fatalf("refused binding was stored: %v", err)
	}

	// Revoked one by one: refused while one is left, bound after.
	g1.State = nvmegate.GrantRevoked
	must(t, db.PutGrant(ctx, g1))
	wantMessage(t, wantError(t, db.CreateHostBinding(ctx, steal), nvmegate.ECONFLICT, ""), "active grant grant-0001-b of another")
	g2.State = nvmegate.GrantRevoked
	must(t, db.PutGrant(ctx, g2))
	must(t, db.CreateHostBinding(ctx, steal))

	// The grants' own node may be bound to the NQN they use.
	must(t, db.PutGrant(ctx, newGrant(3, subNQN(0))))
	must(t, db.CreateHostBinding(ctx, newBinding(3, "acme")))

	// Canonically: an older version's grant in upper case holds the
	// lower-case NQN too.
	legacy := newGrant(4, subNQN(0))
	legacy.HostNQN = upperNQN
	must(t, db.PutGrant(ctx, legacy))
	wantMessage(t, wantError(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(5), HostNQN: lowerNQN}), nvmegate.ECONFLICT, ""),
		"active grant grant-0004 of another")
}

// The reverse race (issue 14): a node's connect described while its NQN
// was free commits after that NQN was bound to another identity, or after
// another node's grant on it committed. The grant's commit checks again,
// canonically, and refuses without naming the other identity.
func TestPutGrantRefusedOnNQNOfAnotherIdentity(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)

	// Bound to node 2: node 1's grant on it is refused, node 2's is made.
	must(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: lowerNQN}))
	g := newGrant(1, subNQN(0))
	g.HostNQN = upperNQN // an older binding's case: the same host
	e := wantError(t, db.PutGrant(ctx, g), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "bound to another identity", "not granted")
	if strings.Contains(e.Message, nodeID(2)) {
		t.Errorf("error names the other identity: %q", e.Message)
	}
	if _, err := db.Grant(ctx, g.ID); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Fatalf("refused grant was stored: %v", err)
	}
	own := newGrant(2, subNQN(0))
	own.HostNQN = lowerNQN
	must(t, db.PutGrant(ctx, own))

	// Unbound, but node 5 holds active grants on it: node 6 is refused
	// (a binding removed while its grants were active leaves this), node
	// 5 may add more, and once they end node 6 may have it.
	held := newGrant(5, subNQN(0))
	must(t, db.PutGrant(ctx, held))
	other := newGrant(6, subNQN(1))
	other.HostNQN = hostNQN(5)
	wantMessage(t, wantError(t, db.PutGrant(ctx, other), nvmegate.ECONFLICT, ""), "in use by another identity's grant")
	more := newGrant(5, subNQN(1))
	more.ID = "grant-0005-b"
	must(t, db.PutGrant(ctx, more))
	// Nodes that sort before and after node 5 (the check looks at the
	// first and the last of the NQN's grants).
	for _, n := range []int{0, 9} {
		g := newGrant(n, subNQN(2))
		g.HostNQN = hostNQN(5)
		wantError(t, db.PutGrant(ctx, g), nvmegate.ECONFLICT, "")
	}
	held.State, more.State = nvmegate.GrantReleased, nvmegate.GrantExpired
	must(t, db.PutGrants(ctx, held, more))
	must(t, db.PutGrant(ctx, other))

	// Ending a grant is never refused, whoever holds its NQN since.
	own.State = nvmegate.GrantRevoked
	must(t, db.PutGrant(ctx, own))
}

// A binding and a grant on the same host NQN for two identities, racing:
// whichever commits first wins, the other is refused, never both. So too
// two nodes' grants on one NQN in one group commit.
func TestHostNQNBindingGrantRace(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	for i := range 40 {
		nqn := hostNQN(100 + i)
		g := newGrant(100+i, subNQN(0))
		g.HostNQN = nqn
		h := &nvmegate.HostBinding{SPIFFEID: nodeID(200 + i), HostNQN: nqn}
		rival := newGrant(300+i, subNQN(1))
		rival.HostNQN = nqn
		errs := make([]error, 3)
		var wg sync.WaitGroup
		wg.Go(func() { errs[0] = db.PutGrant(ctx, g) })
		wg.Go(func() { errs[1] = db.CreateHostBinding(ctx, h) })
		wg.Go(func() { errs[2] = db.PutGrant(ctx, rival) })
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch nvmegate.ErrorCode(err) {
			case "":
				ok++
			case nvmegate.ECONFLICT:
			default:
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d of grant, binding, rival grant made (%v); want exactly one", i, ok, errs)
		}
	}
	must(t, checkInvariants(db))
}

// The host NQN index is filled on open for a file from before it existed.
func TestGrantsByHostRebuilt(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.PutGrant(ctx, newGrant(1, subNQN(0))))
	tamper(t, db, func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketGrantsByHost); err != nil {
			return err
		}
		return initSchema(tx)
	})
	wantMessage(t, wantError(t, db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: nodeID(2), HostNQN: hostNQN(1)}), nvmegate.ECONFLICT, ""),
		"active grant grant-0001")
}
