package store

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
)

func TestTargetRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)

	in := newTarget("t1")
	must(t, db.CreateTarget(ctx, in))
	created := in.CreatedAt
	checkCreatedAt(t, &in.CreatedAt)

	got, err := db.Target(ctx, "t1")
	must(t, err)
	if !got.CreatedAt.Equal(created) {
		t.Errorf("stored CreatedAt = %v, want %v", got.CreatedAt, created)
	}
	checkCreatedAt(t, &got.CreatedAt)
	if !reflect.DeepEqual(got, in) {
		t.Errorf("Target = %+v\nwant %+v", got, in)
	}

	list, next, err := db.ListTargets(ctx, TargetFilter{}, Page{})
	must(t, err)
	if len(list) != 1 || list[0].ID != "t1" || next != "" {
		t.Errorf("ListTargets = %d targets, next %q; want t1 only", len(list), next)
	}

	must(t, db.DeleteTarget(ctx, "t1"))
	_, err = db.Target(ctx, "t1")
	e := wantError(t, err, nvmegate.ENOTFOUND, "")
	wantMessage(t, e, `target "t1"`)
	wantError(t, db.DeleteTarget(ctx, "t1"), nvmegate.ENOTFOUND, "")
}

func TestCreateTargetInvalid(t *testing.T) {
	db := openTestDB(t)
	in := newTarget("t1")
	in.Region = "EU West"
	err := db.CreateTarget(context.Background(), in)
	wantError(t, err, nvmegate.EINVALID, "region")
	if want := in.Validate(); !reflect.DeepEqual(err, want) {
		t.Errorf("error = %#v, want Validate's %#v unchanged", err, want)
	}
	if !in.CreatedAt.IsZero() {
		t.Errorf("CreatedAt set on a failed create: %v", in.CreatedAt)
	}

	in = newTarget("t1")
	in.Ports[1].Address = "nope"
	wantError(t, db.CreateTarget(context.Background(), in), nvmegate.EINVALID, "ports[1].address")
	wantError(t, db.CreateTarget(context.Background(), nil), nvmegate.EINVALID, "")
}

func TestCreateTargetDuplicate(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	dup := newTarget("t1")
	dup.Region = "us-east"
	err := db.CreateTarget(ctx, dup)
	e := wantError(t, err, nvmegate.EEXISTS, "")
	if e.Message != `target "t1" already exists` {
		t.Errorf("message = %q", e.Message)
	}
	if !dup.CreatedAt.IsZero() {
		t.Errorf("CreatedAt set on a failed create")
	}
	got, err := db.Target(ctx, "t1")
	must(t, err)
	if got.Region != "eu-west" {
		t.Errorf("duplicate create overwrote the target: region %q", got.Region)
	}
}

func TestDeleteTargetWithSubsystems(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	must(t, db.CreateTarget(ctx, newTarget("t2")))
	for i := range 5 {
		must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(i), "t1", "acme")))
	}
	// A subsystem of "t2" with a target ID that t1 is a prefix of would be
	// counted by a prefix scan without separator; "t1" vs "t10" shows it.
	must(t, db.CreateTarget(ctx, newTarget("t10")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(99), "t10", "acme")))

	err := db.DeleteTarget(ctx, "t1")
	e := wantError(t, err, nvmegate.ECONFLICT, "")
	wantMessage(t, e, `target "t1"`, "5 subsystems", subNQN(0), "and 2 more")
	if _, err := db.Target(ctx, "t1"); err != nil {
		t.Fatalf("target deleted despite conflict: %v", err)
	}

	must(t, db.DeleteTarget(ctx, "t2")) // no subsystems
	for i := range 5 {
		must(t, db.DeleteSubsystem(ctx, subNQN(i)))
	}
	must(t, db.DeleteTarget(ctx, "t1"))
	wantError(t, db.DeleteTarget(ctx, "t10"), nvmegate.ECONFLICT, "")
}

func TestListTargetsFilter(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	for _, c := range []struct{ id, region, fabric string }{
		{"a", "eu-west", "fab-a"}, {"b", "eu-west", "fab-b"}, {"c", "us-east", "fab-a"}, {"d", "eu-west", "fab-a"},
	} {
		tg := newTarget(c.id)
		tg.Region, tg.Fabric = c.region, c.fabric
		must(t, db.CreateTarget(ctx, tg))
	}
	for _, c := range []struct {
		f    TargetFilter
		want []string
	}{
		{TargetFilter{}, []string{"a", "b", "c", "d"}},
		{TargetFilter{Region: "eu-west"}, []string{"a", "b", "d"}},
		{TargetFilter{Fabric: "fab-a"}, []string{"a", "c", "d"}},
		{TargetFilter{Region: "eu-west", Fabric: "fab-a"}, []string{"a", "d"}},
		{TargetFilter{Region: "ap-south"}, []string{}},
	} {
		got, next, err := db.ListTargets(ctx, c.f, Page{})
		must(t, err)
		ids := []string{}
		for _, tg := range got {
			ids = append(ids, tg.ID)
		}
		if !reflect.DeepEqual(ids, c.want) || next != "" {
			t.Errorf("ListTargets(%+v) = %v next %q, want %v", c.f, ids, next, c.want)
		}
	}
}

func TestCreatedAtFromClock(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	db, err := Open(t.TempDir()+"/s.db", Options{Now: func() time.Time { return now }})
	must(t, err)
	defer db.Close()
	tg := newTarget("t1")
	must(t, db.CreateTarget(context.Background(), tg))
	got, err := db.Target(context.Background(), "t1")
	must(t, err)
	if !tg.CreatedAt.Equal(now) || !got.CreatedAt.Equal(now) {
		t.Errorf("CreatedAt = %v / stored %v, want %v", tg.CreatedAt, got.CreatedAt, now)
	}
}
