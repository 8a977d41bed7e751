package store

import (
	"context"
	"reflect"
	"testing"

	"github.com/nvmegate/nvmegate"
)

func TestSubsystemRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateTarget(ctx, newTarget("t1")))

	in := newSubsystem(subNQN(1), "t1", "acme")
	in.PortIDs = []uint16{2, 1}
	in.TLS = true
	must(t, db.CreateSubsystem(ctx, in))
	created := in.CreatedAt
	checkCreatedAt(t, &in.CreatedAt)

	got, err := db.Subsystem(ctx, subNQN(1))
	must(t, err)
	if !got.CreatedAt.Equal(created) {
		t.Errorf("stored CreatedAt = %v, want %v", got.CreatedAt, created)
	}
	checkCreatedAt(t, &got.CreatedAt)
	if !reflect.DeepEqual(got, in) {
		t.Errorf("Subsystem = %+v\nwant %+v", got, in)
	}

	must(t, db.DeleteSubsystem(ctx, subNQN(1)))
	_, err = db.Subsystem(ctx, subNQN(1))
	wantMessage(t, wantError(t, err, nvmegate.ENOTFOUND, ""), subNQN(1))
	wantError(t, db.DeleteSubsystem(ctx, subNQN(1)), nvmegate.ENOTFOUND, "")
	// The index entry went with it: the target can go now.
	must(t, db.DeleteTarget(ctx, "t1"))
}

func TestCreateSubsystemRules(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(1), "t1", "acme")))

	tests := []struct {
		name   string
		edit   func(*nvmegate.Subsystem)
		code   string
		field  string
		substr []string
	}{
		{"own validation", func(s *nvmegate.Subsystem) { s.Tenant = "" }, nvmegate.EINVALID, "tenant", nil},
		{"duplicate", func(s *nvmegate.Subsystem) { s.NQN = subNQN(1) }, nvmegate.EEXISTS, "",
			[]string{`subsystem "` + subNQN(1) + `" already exists`}},
		{"no target", func(s *nvmegate.Subsystem) { s.TargetID = "t9" }, nvmegate.EINVALID, "target_id",
			[]string{`no target "t9"`}},
		{"port not on target", func(s *nvmegate.Subsystem) { s.PortIDs = []uint16{1, 7} }, nvmegate.EINVALID, "port_ids[1]",
			[]string{`target "t1" has no port 7`}},
		{"tls without tls port", func(s *nvmegate.Subsystem) { s.TLS = true; s.PortIDs = []uint16{1, 3} }, nvmegate.EINVALID, "tls",
			[]string{"TLS secure channel"}},
		{"no tls on a TLS-only port", func(s *nvmegate.Subsystem) { s.TLS = false; s.PortIDs = []uint16{1, 2} }, nvmegate.EINVALID, "port_ids[1]",
			[]string{`port 2 of target "t1" requires TLS`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSubsystem(subNQN(2), "t1", "acme")
			tc.edit(s)
			err := db.CreateSubsystem(ctx, s)
			e := wantError(t, err, tc.code, tc.field)
			wantMessage(t, e, tc.substr...)
			if !s.CreatedAt.IsZero() {
				t.Errorf("CreatedAt set on a failed create")
			}
		})
	}
	if _, err := db.Subsystem(ctx, subNQN(2)); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		t.Fatalf("a failed create stored the subsystem: %v", err)
	}

	// TLS with an optional-TLS port is fine, as is TLS-only.
	tg := newTarget("t2")
	tg.Ports[0].SecureChannel = nvmegate.SecureChannelOptional
	must(t, db.CreateTarget(ctx, tg))
	s := newSubsystem(subNQN(3), "t2", "acme")
	s.PortIDs, s.TLS, s.DHCHAP = []uint16{1}, true, false
	must(t, db.CreateSubsystem(ctx, s))
}

func TestDeleteSubsystemWithNamespaces(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	must(t, db.CreateTarget(ctx, newTarget("t1")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(1), "t1", "acme")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(1)+"0", "t1", "acme"))) // NQN with subNQN(1) as prefix
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 7, "acme")))
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1)+"0", 1, "acme")))

	e := wantError(t, db.DeleteSubsystem(ctx, subNQN(1)), nvmegate.ECONFLICT, "")
	wantMessage(t, e, subNQN(1), "1 namespace (nsid 7)")

	must(t, db.DeleteNamespace(ctx, subNQN(1), 7))
	must(t, db.DeleteSubsystem(ctx, subNQN(1))) // the "…0" subsystem's namespace does not count
	wantError(t, db.DeleteSubsystem(ctx, subNQN(1)+"0"), nvmegate.ECONFLICT, "")
}

func TestListSubsystemsFilter(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	for _, id := range []string{"t1", "t2", "t10"} {
		must(t, db.CreateTarget(ctx, newTarget(id)))
	}
	// 30 subsystems, round-robin over targets and tenants.
	targets := []string{"t1", "t2", "t10"}
	tenants := []string{"acme", "globex"}
	want := map[SubsystemFilter][]string{}
	for i := range 30 {
		s := newSubsystem(subNQN(i), targets[i%3], tenants[i%2])
		must(t, db.CreateSubsystem(ctx, s))
		for _, f := range []SubsystemFilter{{}, {Tenant: s.Tenant}, {TargetID: s.TargetID}, {Tenant: s.Tenant, TargetID: s.TargetID}} {
			want[f] = append(want[f], s.NQN)
		}
	}
	want[SubsystemFilter{TargetID: "t9"}] = nil
	want[SubsystemFilter{Tenant: "initech"}] = nil
	for f, w := range want {
		// Page size 4 makes the index path resume from tokens too.
		got := collect(t, func(p Page) ([]*nvmegate.Subsystem, string, error) {
			return db.ListSubsystems(ctx, f, p)
		}, 4)
		var nqns []string
		for _, s := range got {
			nqns = append(nqns, s.NQN)
		}
		if !reflect.DeepEqual(nqns, w) {
			t.Errorf("ListSubsystems(%+v) = %v\nwant %v", f, nqns, w)
		}
	}
}

// collect pages through a listing with the given page size and returns all
// records. It fails on a page larger than the size or on a loop.
func collect[T any](tb testing.TB, list func(Page) ([]T, string, error), size int) []T {
	tb.Helper()
	var all []T
	token := ""
	for pages := 0; ; pages++ {
		if pages > 10000 {
			tb.Fatal("listing does not end")
		}
		items, next, err := list(Page{Size: size, Token: token})
		must(tb, err)
		if len(items) > size {
			tb.Fatalf("page of %d items, size %d", len(items), size)
		}
		if next != "" && len(items) != size {
			tb.Fatalf("short page (%d of %d) with a next token", len(items), size)
		}
		all = append(all, items...)
		if next == "" {
			return all
		}
		token = next
	}
}
