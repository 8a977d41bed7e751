package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

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
