package authz_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

// with returns in with f applied to a copy of its resource: every test
// case starts from a well-formed input and changes one thing.
func with(in *authz.Input, f func(r map[string]any)) *authz.Input {
	out := *in
	out.Resource = deepCopy(in.Resource).(map[string]any)
	f(out.Resource)
	return &out
}

func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = deepCopy(x)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, x := range v {
			s[i] = deepCopy(x)
		}
		return s
	}
	return v
}

func obj(r map[string]any, path ...string) map[string]any {
	for _, k := range path {
		r = r[k].(map[string]any)
	}
	return r
}

func ns0(r map[string]any) map[string]any { return r["namespaces"].([]any)[0].(map[string]any) }

func oneNS(class, mode string) []any {
	return []any{nsRec(subNQN, 1, "acme", "eu-west", class, mode, targetRec("t1", "eu-west", "f1"))}
}

// TestRules decides one input per rule of the default policy, through
// Engine.Authorize, and checks the outcome, the exact reasons and the
// obligations (policy/README.md lists the rules).
func TestRules(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	connect := connectInput(oneNS("internal", "ro"))
	admit := admitInput(oneNS("internal", "rw"))
	const ns1 = "namespace nqn.2026-01.org.example:acme-train/1"
	ob := func(o nvmegate.Obligations) *nvmegate.Obligations { return &o }
	for _, tc := range []struct {
		name    string
		in      *authz.Input
		allow   bool
		reasons []string
		ob      *nvmegate.Obligations // checked when set
	}{
		// Roles and actions.
		{"admin inventory", call(adminID, "/nvmegate.v1.Inventory/AddNamespace", map[string]any{"kind": "namespace", "tenant": "acme"}),
			true, []string{"role admin may perform inventory.add_namespace"}, ob(nvmegate.Obligations{})},
		{"admin keys", call(adminID, "/nvmegate.v1.Keys/Rotate", nil), true, []string{"role admin may perform keys.rotate"}, nil},
		{"admin revoke", call(adminID, "/nvmegate.v1.Access/Revoke", nil), true, []string{"role admin may perform access.revoke"}, nil},
		{"admin may not connect", connectAs(adminID, connect), false, []string{"no rule allows role admin to perform access.connect"}, nil},
		{"auditor audit", call(auditorID, "/nvmegate.v1.Audit/Lineage", map[string]any{"kind": "audit", "tenant": "acme"}), true,
			[]string{"role auditor may perform audit.lineage"}, nil},
		{"auditor policy status", call(auditorID, "/nvmegate.v1.Policy/Status", nil), true, []string{"role auditor may perform policy.status"}, nil},
		{"auditor may not explain", call(auditorID, "/nvmegate.v1.Policy/Explain", nil), false,
			[]string{"no rule allows role auditor to perform policy.explain"}, nil},
		{"target agent own target", call(targetID, "/nvmegate.v1.Target/Watch", map[string]any{"kind": "target", "target": targetRec("t1", "eu-west", "f1")}),
			true, []string{"role target may perform target.watch on target t1"}, nil},
		{"target agent other target", call(targetID, "/nvmegate.v1.Target/Watch", map[string]any{"kind": "target", "target": targetRec("t2", "eu-west", "f1")}),
			false, []string{"target agent t1 may act only on its own target"}, nil},

		// Schedulers: their tenant only.
		{"scheduler admit", admit, true, []string{"role scheduler may perform jobs.admit for tenant acme"}, ob(nvmegate.Obligations{})},
		{"scheduler namespace read", call(schedulerID, "/nvmegate.v1.Inventory/GetNamespace", map[string]any{"kind": "namespace", "tenant": "acme", "namespaces": oneNS("internal", "")}),
			true, []string{"role scheduler may perform inventory.get_namespace for tenant acme"}, nil},
		{"scheduler other tenant's job", call(schedulerID, "/nvmegate.v1.Jobs/Get", map[string]any{"kind": "job", "tenant": "globex",
			"job": jobRec("j9", "globex", []string{nodeID}, []string{"eu-west"}, epoch.Add(time.Hour), "active")}),
			false, []string{"a scheduler of tenant acme may act only on tenant acme's resources", "job j9 is not in tenant acme"}, nil},
		{"scheduler admits other tenant's namespace", with(admit, func(r map[string]any) { ns0(r)["tenant"] = "globex" }),
			false, []string{ns1 + " is not in tenant acme"}, nil},
		{"scheduler admits node bound elsewhere", with(admit, func(r map[string]any) { r["nodes"].([]any)[1].(map[string]any)["tenant"] = "globex" }),
			false, []string{"node spiffe://example.org/node/gpu-02 is bound to another tenant"}, nil},
		{"scheduler admits immutable rw", with(admit, func(r map[string]any) { ns0(r)["data_class"] = "immutable" }),
			false, []string{ns1 + " is read-only (data class immutable): mode rw is not allowed"}, nil},
		{"scheduler admits outside allowed regions", with(admit, func(r map[string]any) { obj(r, "job")["allowed_regions"] = []any{"us-east"} }),
			false, []string{ns1 + " is in region eu-west, which job j1 does not allow"}, nil},
		{"scheduler admit expired", with(admit, func(r map[string]any) { obj(r, "job")["expires_at"] = "2026-09-30T00:00:00Z" }),
			false, []string{"job j1 expires at 2026-09-30T00:00:00Z, not after the request time"}, nil},
		{"scheduler may not connect", connectAs(schedulerID, connect), false, []string{"no rule allows role scheduler to perform access.connect"}, nil},

		// Nodes: within an active job that names them, with their binding.
		{"node connect", connect, true, []string{"role node may perform access.connect in job j1"},
			ob(nvmegate.Obligations{MaxTTL: 24 * time.Hour, ReadOnly: true})},
		{"node connect rw", connectInput(oneNS("internal", "rw")), true, nil, ob(nvmegate.Obligations{MaxTTL: 24 * time.Hour})},
		// The fixtures' target is nvmet, where a TLS grant carries
		// DH-HMAC-CHAP too (nvmet does not bind the PSK to the host NQN).
		{"node connect restricted over TLS", connectInput(oneNS("restricted", "ro")), true, nil,
			ob(nvmegate.Obligations{MaxTTL: time.Hour, RequireTLS: true, AuthMode: "both", ReadOnly: true})},
		{"node connect restricted over TLS on SPDK", with(connectInput(oneNS("restricted", "ro")), func(r map[string]any) { obj(r, "target")["driver"] = "spdk" }),
			true, nil, ob(nvmegate.Obligations{MaxTTL: time.Hour, RequireTLS: true, AuthMode: "tls", ReadOnly: true})},
		{"node connect restricted over DH-HMAC-CHAP", with(connectInput(oneNS("restricted", "rw")), func(r map[string]any) { obj(r, "subsystem")["tls"] = false }),
			true, nil, ob(nvmegate.Obligations{MaxTTL: time.Hour, AuthMode: "dhchap", Bidirectional: true, MinDHGroup: "ffdhe3072", MinHash: "sha384"})},
		{"node connect restricted, no capable subsystem", with(connectInput(oneNS("restricted", "rw")), func(r map[string]any) {
			obj(r, "subsystem")["tls"] = false
			obj(r, "subsystem")["dhchap"] = false
		}), false, []string{"subsystem nqn.2026-01.org.example:acme-train supports no authentication option of data class restricted"}, nil},
		{"node connect QoS caps", connectInput(benchNamespaces(3, "rw")), true, nil,
			ob(nvmegate.Obligations{MaxTTL: time.Hour, RequireTLS: true, AuthMode: "both", MaxIOPS: 10000})},
		{"node connect immutable rw", connectInput(oneNS("immutable", "rw")), false,
			[]string{ns1 + " is read-only (data class immutable): mode rw is not allowed"}, nil},
		{"node connect residency", with(connect, func(r map[string]any) { obj(ns0(r), "target")["region"] = "us-east" }),
			false, []string{ns1 + " (region eu-west) may not be served from target t1 in region us-east"}, nil},
		{"node connect fabric fence", with(connect, func(r map[string]any) {
			ns0(r)["region"] = "eu-sovereign"
			obj(ns0(r), "target")["region"] = "eu-central"
			obj(r, "job")["allowed_regions"] = []any{"eu-sovereign"}
		}), false, []string{ns1 + " (region eu-sovereign) may not be served over fabric f1"}, nil},
		{"node not in job", with(connect, func(r map[string]any) { obj(r, "job")["nodes"] = []any{node2ID} }),
			false, []string{"node spiffe://example.org/node/gpu-01 is not in the scope of job j1"}, nil},
		{"node job finished", with(connect, func(r map[string]any) { obj(r, "job")["state"] = "finished" }),
			false, []string{"job j1 is not active (state finished)"}, nil},
		{"node job expired", with(connect, func(r map[string]any) { obj(r, "job")["expires_at"] = "2026-10-01T11:00:00Z" }),
			false, []string{"job j1 expired at 2026-10-01T11:00:00Z"}, nil},
		{"node other binding", with(connect, func(r map[string]any) { obj(r, "host_binding")["spiffe_id"] = node2ID }),
			false, []string{"host binding is not the caller's"}, nil},
		{"node asks for another host NQN", with(connect, func(r map[string]any) { obj(r, "request")["host_nqn"] = "nqn.2014-08.org.nvmexpress:uuid:x" }),
			false, []string{"host NQN nqn.2014-08.org.nvmexpress:uuid:x is not bound to node spiffe://example.org/node/gpu-01"}, nil},
		{"node bound to another tenant", with(connect, func(r map[string]any) { obj(r, "host_binding")["tenant"] = "globex" }),
			false, []string{"node spiffe://example.org/node/gpu-01 is bound to a tenant other than job j1's"}, nil},
		{"node other tenant's namespace", with(connect, func(r map[string]any) { ns0(r)["tenant"] = "globex" }),
			false, []string{ns1 + " is not in job j1's tenant"}, nil},
		{"node release", connectAs(nodeID, connect, "/nvmegate.v1.Access/Release"), true, []string{"role node may perform access.release in job j1"},
			ob(nvmegate.Obligations{})},
		{"node may not admit", connectAs(nodeID, admit, "/nvmegate.v1.Jobs/Admit"), false, []string{"no rule allows role node to perform jobs.admit"}, nil},

		// Everyone: health.
		{"health", call(nodeID, "/grpc.health.v1.Health/Check", nil), true,
			[]string{"any caller of trust domain example.org may perform health.check"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := e.Authorize(context.Background(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != tc.allow || (tc.reasons != nil && !slices.Equal(d.Reasons, tc.reasons)) {
				t.Errorf("got allow=%t %q, want allow=%t %q", d.Allow, d.Reasons, tc.allow, tc.reasons)
			}
			if tc.ob != nil && d.Obligations != *tc.ob {
				t.Errorf("obligations %+v, want %+v", d.Obligations, *tc.ob)
			}
		})
	}
}

// connectAs is in with another caller and, optionally, method.
func connectAs(id string, in *authz.Input, method ...string) *authz.Input {
	m := in.RPC.FullMethod
	if len(method) > 0 {
		m = method[0]
	}
	out := call(id, m, in.Resource)
	return with(out, func(map[string]any) {})
}

// TestGarbledInput: whatever the resource holds, Authorize denies with a
// reason, never allows, never fails, never panics.
func TestGarbledInput(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	connect := connectInput(oneNS("internal", "ro"))
	admit := admitInput(oneNS("internal", "rw"))
	for _, tc := range []struct {
		name   string
		in     *authz.Input
		reason string // one of the reasons, when set
	}{
		{"no resource for a node", call(nodeID, "/nvmegate.v1.Access/Connect", nil), "request names no job"},
		{"job missing for a node", with(connect, func(r map[string]any) { delete(r, "job") }), "request names no job"},
		{"job not an object", with(connect, func(r map[string]any) { r["job"] = "j1" }), "resource.job is not an object"},
		{"nsid as a string", with(connect, func(r map[string]any) { ns0(r)["nsid"] = "1" }),
			"resource.namespaces[0].nsid is not a namespace ID (an integer 1-4294967294)"},
		{"nsid zero", with(connect, func(r map[string]any) { ns0(r)["nsid"] = 0 }),
			"resource.namespaces[0].nsid is not a namespace ID (an integer 1-4294967294)"},
		{"namespaces not an array", with(connect, func(r map[string]any) { r["namespaces"] = map[string]any{"0": 1} }), "resource.namespaces is not an array"},
		{"namespace not an object", with(connect, func(r map[string]any) { r["namespaces"] = []any{"nqn/1"} }), "resource.namespaces[0] is not an object"},
		{"nodes not an array", with(admit, func(r map[string]any) { r["nodes"] = nodeID }), "resource.nodes is not an array"},
		{"job nodes not an array", with(connect, func(r map[string]any) { obj(r, "job")["nodes"] = nodeID }),
			"resource.job.nodes is not an array of strings"},
		{"expiry not a time", with(connect, func(r map[string]any) { obj(r, "job")["expires_at"] = "soon" }), "job j1 has no valid expiry"},
		{"impossible date", with(connect, func(r map[string]any) { obj(r, "job")["expires_at"] = "2027-02-29T00:00:00Z" }), "job j1 has no valid expiry"},
		{"qos not numbers", with(connect, func(r map[string]any) { obj(ns0(r), "qos")["max_iops"] = "lots" }),
			"resource.namespaces[0].qos.max_iops is not a non-negative integer"},
		{"qos negative", with(connect, func(r map[string]any) { obj(ns0(r), "qos")["max_mbps"] = -5 }),
			"resource.namespaces[0].qos.max_mbps is not a non-negative integer"},
		{"qos missing", with(connect, func(r map[string]any) { delete(ns0(r), "qos") }),
			"namespace nqn.2026-01.org.example:acme-train/1 has no qos.max_iops"},
		{"target missing", with(connect, func(r map[string]any) { delete(ns0(r), "target") }),
			"namespace nqn.2026-01.org.example:acme-train/1 has no target.region"},
		{"tls not a boolean", with(connect, func(r map[string]any) { obj(r, "subsystem")["tls"] = "yes" }), "resource.subsystem.tls is not a boolean"},
		{"binding missing", with(connect, func(r map[string]any) { delete(r, "host_binding") }), "request has no host binding for the caller"},
		{"bound not a boolean", with(connect, func(r map[string]any) { obj(r, "host_binding")["bound"] = "yes" }),
			"resource.host_binding.bound is not a boolean"},
		{"request not an object", with(connect, func(r map[string]any) { r["request"] = []any{} }), "resource.request is not an object"},
		{"mode unknown", with(connect, func(r map[string]any) { ns0(r)["mode"] = "write" }), `resource.namespaces[0].mode is not "", "ro" or "rw"`},
		{"class unknown", with(connect, func(r map[string]any) { ns0(r)["data_class"] = "top-secret" }),
			"namespace nqn.2026-01.org.example:acme-train/1 has data class top-secret, which the policy does not define"},
		{"tenant not a string", with(admit, func(r map[string]any) { r["tenant"] = 7 }), "a scheduler of tenant acme may act only on tenant acme's resources"},
		{"regions not strings", with(admit, func(r map[string]any) { obj(r, "job")["allowed_regions"] = []any{"eu-west", 1} }),
			"resource.job.allowed_regions is not an array of strings"},
		{"nil values", with(connect, func(r map[string]any) {
			for k := range r {
				r[k] = nil
			}
		}), ""},
		{"everything a string", with(admit, func(r map[string]any) {
			for k := range r {
				r[k] = "x"
			}
		}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := e.Authorize(context.Background(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow || len(d.Reasons) == 0 || (tc.reason != "" && !slices.Contains(d.Reasons, tc.reason)) {
				t.Errorf("got allow=%t %q, want a deny with %q", d.Allow, d.Reasons, tc.reason)
			}
			for _, r := range d.Reasons {
				if strings.HasPrefix(r, "policy ") || strings.Contains(r, "outside the scope") {
					t.Errorf("no specific reason: %q", d.Reasons)
				}
			}
		})
	}
}
