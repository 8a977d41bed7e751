package authz_test

import (
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

func TestParseCaller(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want authz.Caller
	}{
		{"spiffe://example.org/admin/alice", authz.Caller{Role: "admin", Name: "alice"}},
		{"spiffe://example.org/auditor/eve", authz.Caller{Role: "auditor", Name: "eve"}},
		{"spiffe://example.org/node/gpu-01.rack7", authz.Caller{Role: "node", Name: "gpu-01.rack7"}},
		{"spiffe://example.org/target/t-01", authz.Caller{Role: "target", Name: "t-01"}},
		{"spiffe://example.org/gateway/gw-1", authz.Caller{Role: "gateway", Name: "gw-1"}},
		{"spiffe://example.org/tenant/acme/scheduler/slurm", authz.Caller{Role: "scheduler", Tenant: "acme", Name: "slurm"}},
		{"spiffe://prod.example.com/admin/bob", authz.Caller{Role: "admin", Name: "bob"}},

		// Segments must match exactly.
		{"spiffe://example.org/admin", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/admin/x/y", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/node", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/node/a/b", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/auditor/a/b", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/gateway", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/target/t1/extra", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/acme/scheduler", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/acme/scheduler/slurm/x", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/acme/node/gpu-01", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/acme", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/x/admin/alice", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/Admin/alice", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/admins/alice", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/scheduler/slurm", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/workload/foo", authz.Caller{Role: "unknown"}},
		// Tenants and target IDs must be DNS labels.
		{"spiffe://example.org/tenant/ACME/scheduler/slurm", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/-acme/scheduler/slurm", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/tenant/acme.corp/scheduler/slurm", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/target/T1", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/target/t_1", authz.Caller{Role: "unknown"}},
		{"spiffe://example.org/target/t1.", authz.Caller{Role: "unknown"}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			id := spiffeid.RequireFromString(tc.id)
			want := tc.want
			want.ID = tc.id
			want.TrustDomain = id.TrustDomain().Name()
			if got := authz.ParseCaller(id); got != want {
				t.Errorf("ParseCaller(%s) = %+v, want %+v", tc.id, got, want)
			}
			// A job may name as its nodes exactly the IDs of the node role.
			if isNode := nvmegate.ValidateNodeID("n", tc.id) == nil; isNode != (want.Role == authz.RoleNode) {
				t.Errorf("ValidateNodeID(%s) accepts: %v, role %s", tc.id, isNode, want.Role)
			}
		})
	}
	// A trust domain alone (no workload path) is no known role.
	td := spiffeid.RequireTrustDomainFromString("example.org")
	if got := authz.ParseCaller(td.ID()); got.Role != authz.RoleUnknown || got.Name != "" {
		t.Errorf("trust domain ID: %+v", got)
	}
	if got := authz.ParseCaller(spiffeid.ID{}); got != (authz.Caller{Role: authz.RoleUnknown}) {
		t.Errorf("zero ID: %+v", got)
	}
}

func FuzzParseCaller(f *testing.F) {
	for _, s := range []string{"/admin/a", "/tenant/acme/scheduler/s", "/target/t", "/a/b/c/d/e", "/node/x"} {
		f.Add(s)
	}
	td := spiffeid.RequireTrustDomainFromString("example.org")
	f.Fuzz(func(t *testing.T, path string) {
		id, err := spiffeid.FromPath(td, path)
		if err != nil {
			return
		}
		c := authz.ParseCaller(id)
		if c.ID != id.String() || c.TrustDomain != "example.org" {
			t.Fatalf("%+v", c)
		}
		if isNode := nvmegate.ValidateNodeID("n", id.String()) == nil; isNode != (c.Role == authz.RoleNode) {
			t.Fatalf("%q: ValidateNodeID accepts: %v, role %s", path, isNode, c.Role)
		}
		switch c.Role {
		case authz.RoleUnknown:
			if c.Name != "" || c.Tenant != "" {
				t.Fatalf("unknown with fields: %+v", c)
			}
		case authz.RoleScheduler:
			if c.Tenant == "" || c.Name == "" || path != "/tenant/"+c.Tenant+"/scheduler/"+c.Name {
				t.Fatalf("%q: %+v", path, c)
			}
		default:
			if c.Tenant != "" || c.Name == "" || path != "/"+c.Role+"/"+c.Name {
				t.Fatalf("%q: %+v", path, c)
			}
		}
	})
}

func TestParseFullMethod(t *testing.T) {
	for _, tc := range []struct {
		full       string
		svc, m, ac string
	}{
		{"/nvmegate.v1.Inventory/AddTarget", "nvmegate.v1.Inventory", "AddTarget", "inventory.add_target"},
		{"/grpc.health.v1.Health/Check", "grpc.health.v1.Health", "Check", "health.check"},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "grpc.reflection.v1.ServerReflection", "ServerReflectionInfo", "server_reflection.server_reflection_info"},
		{"/nvmegate.v1.Access/GetTLSKey", "nvmegate.v1.Access", "GetTLSKey", "access.get_tls_key"},
		{"/nvmegate.v1.Access/RenewV2Grant", "nvmegate.v1.Access", "RenewV2Grant", "access.renew_v2_grant"},
		{"/Plain/X", "Plain", "X", "plain.x"},
		{"", "", "", ""},
		{"nvmegate.v1.Inventory/AddTarget", "", "", ""},
		{"/nvmegate.v1.Inventory", "", "", ""},
		{"/nvmegate.v1.Inventory/", "", "", ""},
		{"//AddTarget", "", "", ""},
		{"/a/b/c", "", "", ""},
	} {
		r := authz.ParseFullMethod(tc.full)
		if r.Service != tc.svc || r.Method != tc.m || r.FullMethod != tc.full {
			t.Errorf("ParseFullMethod(%q) = %+v", tc.full, r)
		}
		if got := authz.ActionFromMethod(tc.full); got != tc.ac {
			t.Errorf("ActionFromMethod(%q) = %q, want %q", tc.full, got, tc.ac)
		}
	}
}
