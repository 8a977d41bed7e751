package store

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
)

func newGrant(i int, sub string) *nvmegate.Grant {
	return &nvmegate.Grant{ID: fmt.Sprintf("grant-%04d", i), JobID: "job-1", Tenant: "acme", Node: nodeID(i), HostNQN: hostNQN(i),
		SubsystemNQN: sub, KeyVersion: 1, IssuedAt: t0.UTC(), ExpiresAt: t0.Add(time.Hour).UTC(), State: nvmegate.GrantActive,
		DecisionID: "d", AuditIndex: uint64(i), DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
}

func TestGrants(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	for i := range 4 {
		sub := subNQN(i % 2)
		must(t, db.PutGrant(ctx, newGrant(i, sub)))
	}
	g, err := db.Grant(ctx, "grant-0002")
	must(t, err)
	if !reflect.DeepEqual(g, newGrant(2, subNQN(0))) {
		t.Fatalf("read back %+v", g)
	}
	active, err := db.SubsystemGrants(ctx, subNQN(0))
	must(t, err)
	if len(active) != 2 || active[0].ID != "grant-0000" || active[1].ID != "grant-0002" {
		t.Fatalf("active grants of sub 0: %v", active)
	}
	// A released grant leaves the subsystem's active set, not the store.
	g.State = nvmegate.GrantReleased
	must(t, db.PutGrant(ctx, g))
	active, err = db.SubsystemGrants(ctx, subNQN(0))
	must(t, err)
	if len(active) != 1 {
		t.Fatalf("after release: %d active", len(active))
	}
	list, _, err := db.ListGrants(ctx, GrantFilter{JobID: "job-1", State: nvmegate.GrantReleased}, Page{})
	must(t, err)
	if len(list) != 1 || list[0].ID != "grant-0002" {
		t.Fatalf("released: %v", list)
	}
	// Ended is final: a stale active copy (a renewal racing the release)
	// cannot bring it back.
	stale := newGrant(2, subNQN(0))
	wantError(t, db.PutGrant(ctx, stale), nvmegate.ECONFLICT, "")
	if got, _ := db.Grant(ctx, "grant-0002"); got.State != nvmegate.GrantReleased {
		t.Fatalf("after a stale write: %s", got.State)
	}
	// Its host or subsystem cannot change.
	moved := newGrant(2, subNQN(1))
	wantError(t, db.PutGrant(ctx, moved), nvmegate.ECONFLICT, "")
	wantError(t, db.PutGrant(ctx, &nvmegate.Grant{ID: "x"}), nvmegate.EINVALID, "grant_id")
	_, err = db.Grant(ctx, "grant-9999")
	wantError(t, err, nvmegate.ENOTFOUND, "")
}

// Concurrent grant writes share commits, but one write's error stays its
// own: a grant that may not come back (ended is final) fails alone, and the
// others in its group are stored.
func TestGrantWritesBatched(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	ended := newGrant(999, subNQN(0))
	ended.State = nvmegate.GrantRevoked
	must(t, db.PutGrant(ctx, ended))
	const n = 64
	errs := make(chan error, n+1)
	for i := range n {
		go func() { errs <- db.PutGrant(ctx, newGrant(i, subNQN(i%2))) }()
	}
	revived := newGrant(999, subNQN(0)) // active again: refused
	go func() { errs <- db.PutGrant(ctx, revived) }()
	failed := 0
	for range n + 1 {
		if err := <-errs; err != nil {
			if nvmegate.ErrorCode(err) != nvmegate.ECONFLICT {
				t.Fatalf("unexpected error: %v", err)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d writes failed, want only the revived grant's", failed)
	}
	for i := range n {
		if _, err := db.Grant(ctx, newGrant(i, "").ID); err != nil {
			t.Fatalf("grant %d not stored: %v", i, err)
		}
	}
	if g, _ := db.Grant(ctx, ended.ID); g.State != nvmegate.GrantRevoked {
		t.Fatalf("the revoked grant came back: %s", g.State)
	}
}

// A node's active grants in a job on a subsystem come from their own
// index, which follows the grants' states and is rebuilt for a store made
// before it existed.
func TestNodeGrants(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	for i := range 3 {
		g := newGrant(i, subNQN(0))
		g.Node = nodeID(0) // one node, three grants: two active, one released
		if i == 2 {
			g.State = nvmegate.GrantReleased
		}
		must(t, db.PutGrant(ctx, g))
	}
	must(t, db.PutGrant(ctx, newGrant(7, subNQN(0)))) // another node
	check := func(when string) {
		t.Helper()
		gs, err := db.NodeGrants(ctx, nodeID(0), "job-1", subNQN(0))
		must(t, err)
		if len(gs) != 2 || gs[0].ID != "grant-0000" || gs[1].ID != "grant-0001" {
			t.Fatalf("%s: node grants %v", when, gs)
		}
		if gs, _ := db.NodeGrants(ctx, nodeID(0), "job-2", subNQN(0)); len(gs) != 0 {
			t.Fatalf("%s: another job's grants: %v", when, gs)
		}
	}
	check("indexed on write")
	// Drop the index, as in a file from before it existed: Open rebuilds it.
	tamper(t, db, func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketGrantsByNode); err != nil {
			return err
		}
		return initSchema(tx)
	})
	check("rebuilt")
}

// A move reads each grant as it is at commit (a renewal's new expiry made
// after the mover read it stays), leaves ended grants alone, and a put-back
// undoes only what still has the moved entry.
func TestPutGrantsMoving(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	a, b, c := newGrant(1, subNQN(0)), newGrant(2, subNQN(1)), newGrant(3, subNQN(1))
	must(t, db.PutGrants(ctx, a, b, c))
	c.State = nvmegate.GrantReleased
	must(t, db.PutGrant(ctx, c))
	// b is renewed meanwhile: a later expiry.
	renewed := *b
	renewed.ExpiresAt = b.ExpiresAt.Add(time.Hour)
	must(t, db.PutGrant(ctx, &renewed))

	to := HostEntry{KeyVersion: 2, DHCHAPHash: "sha512", DHGroup: "ffdhe4096", Bidirectional: true}
	a.KeyVersion, a.DHCHAPHash, a.DHGroup = to.KeyVersion, to.DHCHAPHash, to.DHGroup
	must(t, db.PutGrantsMoving(ctx, []*nvmegate.Grant{a}, []string{b.ID, c.ID, "grant-9999"}, nil, to))
	gb, err := db.Grant(ctx, b.ID)
	must(t, err)
	if EntryOf(gb) != to || !gb.ExpiresAt.Equal(renewed.ExpiresAt) {
		t.Fatalf("moved grant: entry %+v expiry %v; want %+v and the renewal's expiry", EntryOf(gb), gb.ExpiresAt, to)
	}
	gc, err := db.Grant(ctx, c.ID)
	must(t, err)
	if gc.State != nvmegate.GrantReleased || gc.KeyVersion != 1 {
		t.Fatalf("an ended grant was moved: %+v", gc)
	}
	// Put back only while it still has the moved entry.
	old := EntryOf(b)
	must(t, db.PutGrantsMoving(ctx, nil, []string{b.ID}, &to, old))
	if gb, _ = db.Grant(ctx, b.ID); EntryOf(gb) != old {
		t.Fatalf("not put back: %+v", EntryOf(gb))
	}
	later := HostEntry{KeyVersion: 3, DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
	must(t, db.PutGrantsMoving(ctx, nil, []string{b.ID}, nil, later))
	must(t, db.PutGrantsMoving(ctx, nil, []string{b.ID}, &to, old)) // a stale put-back
	if gb, _ = db.Grant(ctx, b.ID); EntryOf(gb) != later {
		t.Fatalf("a stale put-back undid a later move: %+v", EntryOf(gb))
	}
}

// HostKeyScopes remembers, per host NQN, each identity's key scopes up to
// the newest root version it held, ended grants included; an older file
// without the index gets it filled on open.
func TestHostKeyScopes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	db := openPath(t, path)
	ctx := context.Background()
	a := newGrant(1, subNQN(0))
	a.KeyScope = "target:t1"
	must(t, db.PutGrant(ctx, a))
	a.State, a.RemovalPending = nvmegate.GrantReleased, true
	must(t, db.PutGrant(ctx, a))
	newer := newGrant(2, subNQN(0))
	newer.HostNQN, newer.Node, newer.KeyScope, newer.KeyVersion = a.HostNQN, a.Node, "target:t1", 3
	must(t, db.PutGrant(ctx, newer))
	other := newGrant(3, subNQN(1)) // another identity on another NQN
	must(t, db.PutGrant(ctx, other))
	want := []HostKeyScope{{Node: a.Node, Scope: "target:t1", Version: 3}}
	got, err := db.HostKeyScopes(ctx, a.HostNQN)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("HostKeyScopes = %v, %v; want %v", got, err, want)
	}
	// An older file: the index is rebuilt from the grants.
	must(t, db.bolt.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketHostKeyScopes) }))
	must(t, db.Close())
	db = openPath(t, path)
	defer db.Close()
	if got, err := db.HostKeyScopes(ctx, a.HostNQN); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after the index was rebuilt: %v, %v; want %v", got, err, want)
	}
}

// A node's new grant ends the grants it replaces in its own commit: they
// are released, superseded by it, pending removal only where their host
// is not the new grant's; one a revocation ended first keeps its state.
func TestOpenGrantSupersedes(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	old, moved, revoked := newGrant(1, subNQN(0)), newGrant(1, subNQN(0)), newGrant(1, subNQN(0))
	moved.ID, revoked.ID = "grant-0101", "grant-0102"
	moved.HostNQN = hostNQN(7) // the node's binding changed since
	must(t, db.PutGrants(ctx, old, moved, revoked))
	revoked.State, revoked.RemovalPending = nvmegate.GrantRevoked, true
	must(t, db.PutGrant(ctx, revoked))

	g := newGrant(1, subNQN(0))
	g.ID = "grant-0200"
	ended, err := db.OpenGrant(ctx, g, nil, true, nil)
	must(t, err)
	if len(ended) != 2 || ended[0].ID != old.ID || ended[1].ID != moved.ID {
		t.Fatalf("superseded %+v, want %s and %s", ended, old.ID, moved.ID)
	}
	for _, e := range ended {
		if e.State != nvmegate.GrantReleased || e.SupersededBy != g.ID || e.RemovalPending != (e.ID == moved.ID) {
			t.Fatalf("superseded %+v: want released by %s, pending only on the other host", e, g.ID)
		}
	}
	if got, _ := db.Grant(ctx, revoked.ID); got.State != nvmegate.GrantRevoked || !got.RemovalPending || got.SupersededBy != "" {
		t.Fatalf("the revoked grant became %+v", got)
	}
	if active, _ := db.NodeActiveGrants(ctx, g.Node); len(active) != 1 || active[0].ID != g.ID {
		t.Fatalf("node's active grants %v, want only %s", active, g.ID)
	}
	_, err = db.OpenGrant(ctx, &nvmegate.Grant{ID: "grant-0300", State: nvmegate.GrantRevoked}, nil, true, nil)
	wantError(t, err, nvmegate.EINVALID, "")
}

// A new grant its target refused is undone with the grants it superseded
// put back — unless its end was another's (a revocation), the job ended,
// or the earlier grant ended in another way or expired.
func TestUndoOpening(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T) (*DB, *nvmegate.Grant, *nvmegate.Grant) {
		db := openTestDB(t)
		old := newGrant(1, subNQN(0))
		old.ExpiresAt = t0.Add(24 * time.Hour)
		must(t, db.PutGrant(ctx, old))
		g := newGrant(1, subNQN(0))
		g.ID = "grant-0200"
		if _, err := db.OpenGrant(ctx, g, nil, true, nil); err != nil {
			t.Fatal(err)
		}
		return db, old, g
	}
	state := func(t *testing.T, db *DB, id string) *nvmegate.Grant {
		t.Helper()
		g, err := db.Grant(ctx, id)
		must(t, err)
		return g
	}
	t.Run("put back", func(t *testing.T) {
		db, old, g := open(t)
		back, err := db.UndoOpening(ctx, g)
		must(t, err)
		if len(back) != 1 || back[0].ID != old.ID || back[0].State != nvmegate.GrantActive || back[0].SupersededBy != "" {
			t.Fatalf("put back %+v", back)
		}
		if u := state(t, db, g.ID); u.State != nvmegate.GrantRevoked || !u.RemovalPending {
			t.Fatalf("undone grant %+v", u)
		}
		if active, _ := db.NodeActiveGrants(ctx, g.Node); len(active) != 1 || active[0].ID != old.ID {
			t.Fatalf("node's active grants %v, want only %s", active, old.ID)
		}
		// Twice (a retried batch, a second undo) puts nothing back twice.
		if back, err := db.UndoOpening(ctx, g); err != nil || len(back) != 0 {
			t.Fatalf("second undo put back %v, %v", back, err)
		}
	})
	t.Run("revoked by another", func(t *testing.T) {
		db, old, g := open(t)
		r := state(t, db, g.ID)
		r.State, r.RemovalPending = nvmegate.GrantRevoked, true
		must(t, db.PutGrant(ctx, r))
		if back, err := db.UndoOpening(ctx, g); err != nil || len(back) != 0 {
			t.Fatalf("put back %v, %v after the new grant's revocation", back, err)
		}
		if o := state(t, db, old.ID); o.State != nvmegate.GrantReleased {
			t.Fatalf("earlier grant %s", o.State)
		}
	})
	t.Run("job ended", func(t *testing.T) {
		db, old, g := open(t)
		inventory(t, db, "acme")
		must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
		must(t, db.CreateJob(ctx, newJob("job-1", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly})))
		if _, _, err := db.FinishJob(ctx, "job-1", nil); err != nil {
			t.Fatal(err)
		}
		if back, err := db.UndoOpening(ctx, g); err != nil || len(back) != 0 {
			t.Fatalf("put back %v, %v in a finished job", back, err)
		}
		if o := state(t, db, old.ID); o.State != nvmegate.GrantReleased || o.SupersededBy != "" {
			t.Fatalf("earlier grant %s, waiting on %q: want released, final", o.State, o.SupersededBy)
		}
	})
	t.Run("released otherwise", func(t *testing.T) {
		db, old, g := open(t)
		o := state(t, db, old.ID)
		o.SupersededBy = "" // as a release by the node would store it
		must(t, db.PutGrant(ctx, o))
		if back, err := db.UndoOpening(ctx, g); err != nil || len(back) != 0 {
			t.Fatalf("put back %v, %v: a grant this one did not supersede", back, err)
		}
	})
	// A connect superseded by a later one of the node before its own undo:
	// its undo hands what it superseded to the later one, whose undo puts
	// that back — never the refused grant.
	t.Run("chain", func(t *testing.T) {
		db, old, a := open(t)
		b := newGrant(1, subNQN(0))
		b.ID = "grant-0300"
		if s, err := db.OpenGrant(ctx, b, nil, true, nil); err != nil || len(s) != 1 || s[0].ID != a.ID {
			t.Fatalf("b superseded %v, %v; want %s", s, err, a.ID)
		}
		if back, err := db.UndoOpening(ctx, a); err != nil || len(back) != 0 {
			t.Fatalf("a's undo put back %v, %v", back, err)
		}
		if o := state(t, db, old.ID); o.State != nvmegate.GrantReleased || o.SupersededBy != b.ID {
			t.Fatalf("earlier grant %s superseded by %q, want released, waiting on %s", o.State, o.SupersededBy, b.ID)
		}
		back, err := db.UndoOpening(ctx, b)
		must(t, err)
		if len(back) != 1 || back[0].ID != old.ID {
			t.Fatalf("b's undo put back %v, want %s", back, old.ID)
		}
		if g := state(t, db, a.ID); g.State != nvmegate.GrantRevoked {
			t.Fatalf("the refused grant came back: %s", g.State)
		}
	})
	// Two connects of the node, the second committed before the first is
	// programmed: only the second stays active.
	t.Run("second connect", func(t *testing.T) {
		db, _, a := open(t)
		b := newGrant(1, subNQN(0))
		b.ID = "grant-0300"
		if _, err := db.OpenGrant(ctx, b, nil, true, nil); err != nil {
			t.Fatal(err)
		}
		if active, _ := db.NodeActiveGrants(ctx, a.Node); len(active) != 1 || active[0].ID != b.ID {
			t.Fatalf("node's active grants %v, want only %s", active, b.ID)
		}
	})
	// Put back from another host entry (the binding changed meanwhile):
	// pending removal no more, in the file as in memory.
	t.Run("other host", func(t *testing.T) {
		db := openTestDB(t)
		old := newGrant(1, subNQN(0))
		old.HostNQN, old.ExpiresAt = hostNQN(7), t0.Add(24*time.Hour)
		must(t, db.PutGrant(ctx, old))
		g := newGrant(1, subNQN(0))
		g.ID = "grant-0200"
		s, err := db.OpenGrant(ctx, g, nil, true, nil)
		if err != nil || len(s) != 1 || !s[0].RemovalPending {
			t.Fatalf("superseded %v, %v: want the other host's grant pending", s, err)
		}
		back, err := db.UndoOpening(ctx, g)
		if err != nil || len(back) != 1 {
			t.Fatalf("put back %v, %v", back, err)
		}
		if p, _ := db.PendingRemovals(ctx); len(p) != 1 || p[0].ID != g.ID {
			t.Fatalf("pending removals %v, want only the undone %s", p, g.ID)
		}
	})
	// Ending the successor otherwise (the node's release) makes what it
	// superseded final.
	t.Run("successor released", func(t *testing.T) {
		db, old, g := open(t)
		r := state(t, db, g.ID)
		r.State = nvmegate.GrantReleased
		must(t, db.PutGrant(ctx, r))
		if o := state(t, db, old.ID); o.SupersededBy != "" {
			t.Fatalf("earlier grant still waits on %s", o.SupersededBy)
		}
	})
	t.Run("expired", func(t *testing.T) {
		db, old, g := open(t)
		o := state(t, db, old.ID)
		o.ExpiresAt = t0
		must(t, db.PutGrant(ctx, o))
		if back, err := db.UndoOpening(ctx, g); err != nil || len(back) != 0 {
			t.Fatalf("put back %v, %v past its expiry", back, err)
		}
	})
}

// The model's copy of a stored grant (storedGrant) is the grant as the
// file holds it, decoded: field for field, for grants of every state, with
// times in other zones and with monotonic readings, pending removal and
// successors set where the file drops them.
func TestStoredGrantIsTheDecodedRecord(t *testing.T) {
	now := time.Now() // a monotonic reading
	cet := time.FixedZone("CET", 3600)
	for i, st := range []string{nvmegate.GrantActive, nvmegate.GrantReleased, nvmegate.GrantRevoked, nvmegate.GrantExpired} {
		for _, mut := range []func(g *nvmegate.Grant){
			func(*nvmegate.Grant) {},
			func(g *nvmegate.Grant) { g.IssuedAt, g.ExpiresAt = now, now.Add(time.Hour).In(cet) },
			func(g *nvmegate.Grant) { g.RemovalPending, g.SupersededBy = true, "grant-9999" },
			func(g *nvmegate.Grant) { g.TLS, g.ReadOnly, g.KeyScope, g.Bidirectional = true, true, "t1/sub", false },
		} {
			g := newGrant(i, subNQN(0))
			g.State = st
			mut(g)
			v, err := encodeGrant(g)
			must(t, err)
			want, err := decodeGrant(v)
			must(t, err)
			if got := storedGrant(g); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: storedGrant\n%+v\ndecoded\n%+v", st, got, want)
			}
		}
	}
}
