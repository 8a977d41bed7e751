package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"

	"github.com/nvmegate/nvmegate"
)

// inventory creates target t1 and subsystems subNQN(0..) with the given
// tenants.
func inventory(tb testing.TB, db *DB, tenants ...string) {
	tb.Helper()
	ctx := context.Background()
	must(tb, db.CreateTarget(ctx, newTarget("t1")))
	for i, tenant := range tenants {
		must(tb, db.CreateSubsystem(ctx, newSubsystem(subNQN(i), "t1", tenant)))
	}
}

func TestNamespaceRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	inventory(t, db, "acme")

	in := newNamespace(subNQN(0), nvmegate.MaxNSID, "acme")
	must(t, db.CreateNamespace(ctx, in))
	created := in.CreatedAt
	checkCreatedAt(t, &in.CreatedAt)

	got, err := db.Namespace(ctx, subNQN(0), nvmegate.MaxNSID)
	must(t, err)
	if !got.CreatedAt.Equal(created) {
		t.Errorf("stored CreatedAt = %v, want %v", got.CreatedAt, created)
	}
	checkCreatedAt(t, &got.CreatedAt)
	if !reflect.DeepEqual(got, in) {
		t.Errorf("Namespace = %+v\nwant %+v", got, in)
	}

	_, err = db.Namespace(ctx, subNQN(0), 1)
	wantMessage(t, wantError(t, err, nvmegate.ENOTFOUND, ""), "namespace 1 of subsystem", subNQN(0))
	must(t, db.DeleteNamespace(ctx, subNQN(0), nvmegate.MaxNSID))
	_, err = db.Namespace(ctx, subNQN(0), nvmegate.MaxNSID)
	wantError(t, err, nvmegate.ENOTFOUND, "")
	wantError(t, db.DeleteNamespace(ctx, subNQN(0), nvmegate.MaxNSID), nvmegate.ENOTFOUND, "")
}

func TestCreateNamespaceRules(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	inventory(t, db, "acme", "globex")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))

	t.Run("own validation", func(t *testing.T) {
		n := newNamespace(subNQN(0), 0, "acme")
		err := db.CreateNamespace(ctx, n)
		wantError(t, err, nvmegate.EINVALID, "nsid")
		if !reflect.DeepEqual(err, n.Validate()) {
			t.Errorf("error %#v is not Validate's", err)
		}
	})
	t.Run("no subsystem", func(t *testing.T) {
		err := db.CreateNamespace(ctx, newNamespace(subNQN(9), 1, "acme"))
		wantMessage(t, wantError(t, err, nvmegate.EINVALID, "subsystem_nqn"), `no subsystem "`+subNQN(9)+`"`)
	})
	t.Run("other tenant", func(t *testing.T) {
		n := newNamespace(subNQN(0), 2, "globex")
		err := db.CreateNamespace(ctx, n)
		e := wantError(t, err, nvmegate.EINVALID, "tenant")
		wantMessage(t, e, `"globex"`, `"acme"`, subNQN(0), "all namespaces of a subsystem belong to its tenant")
		if !n.CreatedAt.IsZero() {
			t.Errorf("CreatedAt set on a failed create")
		}
		if _, err := db.Namespace(ctx, subNQN(0), 2); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
			t.Errorf("namespace stored despite the tenant rule: %v", err)
		}
	})
	t.Run("region other than the target's", func(t *testing.T) {
		n := newNamespace(subNQN(0), 3, "acme")
		n.Region = "us-east"
		err := db.CreateNamespace(ctx, n)
		wantMessage(t, wantError(t, err, nvmegate.EINVALID, "region"), `"us-east"`, `"eu-west"`, "resides where its target is")
		if _, err := db.Namespace(ctx, subNQN(0), 3); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
			t.Errorf("namespace stored despite the region rule: %v", err)
		}
	})
	t.Run("duplicate nsid", func(t *testing.T) {
		err := db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme"))
		wantMessage(t, wantError(t, err, nvmegate.EEXISTS, ""), "namespace 1 of subsystem", "already exists")
	})
	t.Run("same nsid in another subsystem", func(t *testing.T) {
		must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "globex")))
	})
	t.Run("backing device", func(t *testing.T) {
		n := newNamespace(subNQN(0), 4, "acme")
		n.BackingDevice = "/dev/nvme0n1"
		must(t, db.CreateNamespace(ctx, n))
		got, err := db.Namespace(ctx, subNQN(0), 4)
		if err != nil || got.BackingDevice != "/dev/nvme0n1" {
			t.Fatalf("stored backing device: %+v %v", got, err)
		}
		// The same device on the same target, in any subsystem: refused.
		o := newNamespace(subNQN(1), 5, "globex")
		o.BackingDevice = "/dev/nvme0n1"
		wantMessage(t, wantError(t, db.CreateNamespace(ctx, o), nvmegate.ECONFLICT, ""), "already holds namespace 4")
		for _, bad := range []string{"dev/sda", "/dev/../etc/passwd", "/dev/a b", "/dev/a,b", "/etc/shadow"} {
			o.BackingDevice = bad
			wantError(t, db.CreateNamespace(ctx, o), nvmegate.EINVALID, "backing_device")
		}
	})
}

func TestListNamespacesOrderAndFilter(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	inventory(t, db, "acme", "globex", "acme")
	// subNQN(0)+"0" has subNQN(0) as a prefix: a subsystem filter must not
	// pick up its namespaces. It sits on a target in another region.
	us := newTarget("t-us")
	us.Region = "us-east"
	must(t, db.CreateTarget(ctx, us))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(0)+"0", "t-us", "globex")))

	type key struct {
		nqn  string
		nsid uint32
	}
	var all []key
	for _, nqn := range []string{subNQN(0), subNQN(0) + "0", subNQN(1), subNQN(2)} {
		s, err := db.Subsystem(ctx, nqn)
		must(t, err)
		for _, nsid := range []uint32{1, 2, 10, 256, 70000} { // numeric, not lexical, order
			n := newNamespace(nqn, nsid, s.Tenant)
			if s.TargetID == "t-us" {
				n.Region = "us-east"
			}
			must(t, db.CreateNamespace(ctx, n))
			all = append(all, key{nqn, nsid})
		}
	}
	for _, c := range []struct {
		f     NamespaceFilter
		match func(k key) bool
	}{
		{NamespaceFilter{}, func(key) bool { return true }},
		{NamespaceFilter{SubsystemNQN: subNQN(0)}, func(k key) bool { return k.nqn == subNQN(0) }},
		{NamespaceFilter{Tenant: "globex"}, func(k key) bool { return k.nqn == subNQN(1) || k.nqn == subNQN(0)+"0" }},
		{NamespaceFilter{Region: "us-east"}, func(k key) bool { return k.nqn == subNQN(0)+"0" }},
		{NamespaceFilter{Tenant: "acme", Region: "eu-west", SubsystemNQN: subNQN(2)}, func(k key) bool { return k.nqn == subNQN(2) }},
		{NamespaceFilter{Tenant: "acme", Region: "us-east"}, func(key) bool { return false }},
		{NamespaceFilter{SubsystemNQN: subNQN(9)}, func(key) bool { return false }},
		{NamespaceFilter{Tenant: "globex", SubsystemNQN: subNQN(0)}, func(key) bool { return false }},
	} {
		var want []key
		for _, k := range all {
			if c.match(k) {
				want = append(want, k)
			}
		}
		for _, size := range []int{1, 3, 100} {
			got := collect(t, func(p Page) ([]*nvmegate.Namespace, string, error) { return db.ListNamespaces(ctx, c.f, p) }, size)
			var keys []key
			for _, n := range got {
				keys = append(keys, key{n.SubsystemNQN, n.NSID})
			}
			if !reflect.DeepEqual(keys, want) {
				t.Errorf("ListNamespaces(%+v, size %d) = %v\nwant %v", c.f, size, keys, want)
			}
		}
	}
}

// TestTenantInvariantRandomized throws random creates and deletes across
// tenants at the store and checks each answer against a model, then that
// every subsystem's namespaces share its tenant.
func TestTenantInvariantRandomized(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	rng := rand.New(rand.NewPCG(2026, 1))
	tenants := []string{"acme", "globex", "initech", "umbrella"}

	must(t, db.CreateTarget(ctx, newTarget("t1")))
	const nsubs = 12
	subTenant := map[string]string{}
	for i := range nsubs {
		tenant := tenants[rng.IntN(len(tenants))]
		must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(i), "t1", tenant)))
		subTenant[subNQN(i)] = tenant
	}
	type key struct {
		nqn  string
		nsid uint32
	}
	model := map[key]bool{}
	var created, refused, conflicts, deleted int
	for range 1500 {
		// One subsystem index past the end names a missing subsystem.
		nqn := subNQN(rng.IntN(nsubs + 1))
		nsid := uint32(1 + rng.IntN(40))
		tenant := tenants[rng.IntN(len(tenants))]
		k := key{nqn, nsid}
		if rng.IntN(5) == 0 {
			err := db.DeleteNamespace(ctx, nqn, nsid)
			if model[k] {
				must(t, err)
				delete(model, k)
				deleted++
			} else {
				wantError(t, err, nvmegate.ENOTFOUND, "")
			}
			continue
		}
		err := db.CreateNamespace(ctx, newNamespace(nqn, nsid, tenant))
		switch st, ok := subTenant[nqn]; {
		case model[k]:
			wantError(t, err, nvmegate.EEXISTS, "")
			conflicts++
		case !ok:
			wantError(t, err, nvmegate.EINVALID, "subsystem_nqn")
		case st != tenant:
			wantError(t, err, nvmegate.EINVALID, "tenant")
			refused++
		default:
			must(t, err)
			model[k] = true
			created++
		}
	}
	if created == 0 || refused == 0 || conflicts == 0 || deleted == 0 {
		t.Fatalf("weak run: %d created, %d refused, %d conflicts, %d deleted", created, refused, conflicts, deleted)
	}

	all := collect(t, func(p Page) ([]*nvmegate.Namespace, string, error) {
		return db.ListNamespaces(ctx, NamespaceFilter{}, p)
	}, 50)
	if len(all) != len(model) {
		t.Errorf("store has %d namespaces, model %d", len(all), len(model))
	}
	seen := map[string]string{}
	for _, n := range all {
		if !model[key{n.SubsystemNQN, n.NSID}] {
			t.Errorf("namespace %s/%d is not in the model", n.SubsystemNQN, n.NSID)
		}
		if n.Tenant != subTenant[n.SubsystemNQN] {
			t.Errorf("namespace %s/%d has tenant %q, its subsystem %q", n.SubsystemNQN, n.NSID, n.Tenant, subTenant[n.SubsystemNQN])
		}
		if prev, ok := seen[n.SubsystemNQN]; ok && prev != n.Tenant {
			t.Errorf("subsystem %s has namespaces of tenants %q and %q", n.SubsystemNQN, prev, n.Tenant)
		}
		seen[n.SubsystemNQN] = n.Tenant
	}

	// The tenant-filtered listing (which seeks past other tenants'
	// subsystems) returns exactly each tenant's share of the full listing.
	for _, tenant := range tenants {
		var want, got []string
		for _, n := range all {
			if n.Tenant == tenant {
				want = append(want, fmt.Sprintf("%s/%d", n.SubsystemNQN, n.NSID))
			}
		}
		for _, n := range collect(t, func(p Page) ([]*nvmegate.Namespace, string, error) {
			return db.ListNamespaces(ctx, NamespaceFilter{Tenant: tenant}, p)
		}, 13) {
			got = append(got, fmt.Sprintf("%s/%d", n.SubsystemNQN, n.NSID))
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("tenant %s: listed %d namespaces, want %d", tenant, len(got), len(want))
		}
	}
}

// TestTenantInvariantConcurrent races creates of every tenant into one
// subsystem: only its own tenant's may win, each NSID exactly once.
func TestTenantInvariantConcurrent(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	inventory(t, db, "acme")
	tenants := []string{"acme", "globex", "initech"}

	// Two writers per tenant, same NSIDs; each writer records its own
	// results. For acme, EEXISTS only means the other acme writer won.
	type result struct {
		tenant string
		errs   []error
	}
	results := make([]result, 2*len(tenants))
	var wg sync.WaitGroup
	for w := range results {
		r := &results[w]
		r.tenant = tenants[w/2]
		wg.Go(func() {
			for nsid := range uint32(30) {
				r.errs = append(r.errs, db.CreateNamespace(ctx, newNamespace(subNQN(0), nsid+1, r.tenant)))
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		for i, err := range r.errs {
			switch code := nvmegate.ErrorCode(err); {
			case r.tenant == "acme" && code != "" && code != nvmegate.EEXISTS:
				t.Errorf("acme nsid %d: %v", i+1, err)
			case r.tenant != "acme" && code != nvmegate.EINVALID && code != nvmegate.EEXISTS:
				t.Errorf("%s nsid %d: error %v, want EINVALID or EEXISTS", r.tenant, i+1, err)
			}
		}
	}
	got, _, err := db.ListNamespaces(ctx, NamespaceFilter{SubsystemNQN: subNQN(0)}, Page{})
	must(t, err)
	if len(got) != 30 {
		t.Errorf("%d namespaces, want 30", len(got))
	}
	for _, n := range got {
		if n.Tenant != "acme" {
			t.Errorf("namespace %d has tenant %s", n.NSID, n.Tenant)
		}
	}
}
