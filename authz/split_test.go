package authz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// withModule is the embedded bundle with one more module.
func withModule(t *testing.T, name, src string) *policy.Bundle {
	t.Helper()
	embedded, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	fsys := copyFS(t, embedded)
	fsys[name] = &fstest.MapFile{Data: []byte(src)}
	b, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSplitRefusesImpureRules: a rule the memoized scope or caller decision
// reaches may not depend on what their inputs do not hold, nor call a
// nondeterministic builtin; such a policy does not load, and the error
// names the rule and where it belongs.
func TestSplitRefusesImpureRules(t *testing.T) {
	for _, tc := range []struct {
		name, src, rule, what string
		part                  string
	}{
		{"scope rule calls time.now_ns", `package nvmegate.authz
scope_decision_problems contains "too late" if time.now_ns() > 0
`, "nvmegate.authz.scope_decision_problems", "calls time.now_ns (nondeterministic)", "scope"},
		{"scope rule reads input.caller", `package nvmegate.authz
scope_decision_problems contains "not you" if input.caller.id == "spiffe://example.org/node/x"
`, "nvmegate.authz.scope_decision_problems", "reads input.caller", "scope"},
		{"scope rule reads input.time through a helper", `package nvmegate.authz
scope_decision_problems contains "late" if late_job
late_job if input.time > "2030"
`, "nvmegate.authz.late_job", "reads input.time", "scope"},
		{"scope rule reads the whole input", `package nvmegate.authz
scope_decision_problems contains "x" if object.get(input, "x", false)
`, "nvmegate.authz.scope_decision_problems", "reads the whole input", "scope"},
		{"scope rule calls rand.intn in another package", `package site
lucky if rand.intn("x", 2) == 0
`, "site.lucky", "calls rand.intn (nondeterministic)", "scope"},
		{"caller rule reads input.time", `package nvmegate.authz
caller_role_grant("audit") := {"reason": "r", "scoped": false} if input.time < "2030"
`, "nvmegate.authz.caller_role_grant", "reads input.time", "caller"},
		{"caller rule calls uuid.rfc4122", `package nvmegate.authz
caller_role_grant("audit") := {"reason": uuid.rfc4122("x"), "scoped": false}
`, "nvmegate.authz.caller_role_grant", "calls uuid.rfc4122 (nondeterministic)", "caller"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := tc.src
			if strings.HasPrefix(src, "package site") { // reached from the scope decision
				src += "\n"
				b := withModule(t, "site.rego", src)
				b2, err := b.With(map[string][]byte{"hook.rego": []byte("package nvmegate.authz\nscope_decision_problems contains \"x\" if data.site.lucky\n")})
				if err != nil {
					t.Fatal(err)
				}
				checkRefused(t, b2, tc.rule, tc.what, "scope")
				return
			}
			checkRefused(t, withModule(t, "impure.rego", src), tc.rule, tc.what, tc.part)
		})
	}
	// The node decision may read the time and the caller and call
	// nondeterministic builtins.
	b := withModule(t, "node.rego", `package nvmegate.authz
problems contains "late" if {
	input.action in split_actions
	time.now_ns() < 0
	input.caller.id == input.time
}
`)
	if _, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: b}); err != nil {
		t.Errorf("node rule refused: %v", err)
	}
}

func checkRefused(t *testing.T, b *policy.Bundle, rule, what, part string) {
	t.Helper()
	_, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: b})
	if !errors.Is(err, authz.ErrCompile) {
		t.Fatalf("NewEngine: %v, want ErrCompile", err)
	}
	for _, want := range []string{"rule " + rule + " (", what, "the " + part + " decision is memoized", "belongs in the node decision"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestSplitMemo: the same scope and caller are decided once; a changed
// record, a changed caller record or a new revision is decided again, and
// the decision follows the change.
func TestSplitMemo(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	ctx := context.Background()
	in := connectInput(benchNamespaces(8, "ro"))
	decide := func(in *authz.Input) *nvmegate.Decision {
		t.Helper()
		d, err := e.Authorize(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	evals := func() [2]uint64 { s, c := authz.SplitEvals(e); return [2]uint64{s, c} }
	if d := decide(in); !d.Allow {
		t.Fatalf("%+v", d)
	}
	if got := evals(); got != [2]uint64{1, 1} {
		t.Fatalf("evaluations %v, want one of each", got)
	}
	// The same request again, and as another node of the job: the scope is
	// reused, the caller decided once more.
	decide(in)
	if got := evals(); got != [2]uint64{1, 1} {
		t.Errorf("same request: evaluations %v", got)
	}
	other := connectAs(node2ID, in)
	other.Resource["host_binding"] = bindingRec(node2ID, "nqn.2014-08.org.nvmexpress:uuid:5d1e3c52-4a8e-5f0b-8c9d-2e4f6a8b0c1d", "acme", true)
	other.Resource["request"] = map[string]any{"host_nqn": "", "ttl": "", "mode": ""}
	if d := decide(other); !d.Allow {
		t.Errorf("other node: %+v", d)
	}
	if got := evals(); got != [2]uint64{1, 2} {
		t.Errorf("other node: evaluations %v, want the scope reused", got)
	}

	for _, tc := range []struct {
		name    string
		change  func(r map[string]any)
		reasons []string
		ob      nvmegate.Obligations
	}{
		{"a namespace's region", func(r map[string]any) { ns0(r)["region"] = "us-east" },
			[]string{
				"namespace nqn.2026-01.org.example:acme-train/1 (region us-east) may not be served from target t1 in region eu-west",
				"namespace nqn.2026-01.org.example:acme-train/1 is in region us-east, which job j1 does not allow",
			}, nvmegate.Obligations{}},
		{"a namespace's target", func(r map[string]any) { obj(ns0(r), "target")["region"] = "us-east" },
			[]string{"namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-east"}, nvmegate.Obligations{}},
		{"the job's namespaces (mode rw)", func(r map[string]any) { ns0(r)["mode"] = "rw" },
			nil, nvmegate.Obligations{MaxTTL: time.Hour, RequireTLS: true, AuthMode: "both", MaxIOPS: 10000}},
		{"the job's allowed regions", func(r map[string]any) { obj(r, "job")["allowed_regions"] = []any{"eu-central"} }, nil, nvmegate.Obligations{}},
		{"a namespace's class", func(r map[string]any) { ns0(r)["data_class"] = "immutable"; ns0(r)["mode"] = "rw" },
			[]string{"namespace nqn.2026-01.org.example:acme-train/1 is read-only (data class immutable): mode rw is not allowed"}, nvmegate.Obligations{}},
		{"the binding's tenant", func(r map[string]any) { obj(r, "host_binding")["tenant"] = "globex" },
			[]string{"node spiffe://example.org/node/gpu-01 is bound to a tenant other than job j1's"}, nvmegate.Obligations{}},
		{"the job's state", func(r map[string]any) { obj(r, "job")["state"] = "finished" },
			[]string{"job j1 is not active (state finished)"}, nvmegate.Obligations{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := evals()
			changed := with(in, tc.change)
			d := decide(changed)
			if tc.reasons != nil && (d.Allow || !slices.Equal(d.Reasons, tc.reasons)) {
				t.Errorf("got allow=%t %q, want %q", d.Allow, d.Reasons, tc.reasons)
			}
			if tc.reasons == nil && tc.ob != (nvmegate.Obligations{}) && (!d.Allow || d.Obligations != tc.ob) {
				t.Errorf("got %+v, want an allow with %+v", d, tc.ob)
			}
			if after := evals(); after[1] == before[1] {
				t.Errorf("a changed record was not decided again (evaluations %v → %v)", before, after)
			}
			// And back: the original is still what it was.
			if d := decide(in); !d.Allow {
				t.Errorf("original after change: %+v", d)
			}
		})
	}

	// A new revision (its data shortens the internal class's grants)
	// decides the same request afresh.
	oneInternal := connectInput(oneNS("internal", "ro"))
	if d := decide(oneInternal); !d.Allow || d.Obligations.MaxTTL != 24*time.Hour {
		t.Fatalf("before the reload: %+v", d)
	}
	embedded, _ := policy.Load(policy.Default())
	fsys := copyFS(t, embedded)
	fsys["data.json"] = &fstest.MapFile{Data: []byte(strings.Replace(string(mustRead(t, fsys, "data.json")),
		`"internal": {"max_ttl": "24h"}`, `"internal": {"max_ttl": "12h"}`, 1))}
	nb, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(ctx, nb, "test"); err != nil {
		t.Fatal(err)
	}
	if got := evals(); got != [2]uint64{} {
		t.Errorf("new revision starts with evaluations %v", got)
	}
	d := decide(oneInternal)
	if !d.Allow || d.PolicyRevision != nb.Revision || d.Obligations.MaxTTL != 12*time.Hour {
		t.Errorf("after the reload: %+v", d)
	}
}

// TestSplitMatchesDecisionQuery: for requests of every kind (the rule
// table, garbled inputs, random worlds), the engine's parts, built in Go,
// decide as DecisionQuery, whose parts are built in Rego; with the
// resource typed (and no map) the decision is the same again.
func TestSplitMatchesDecisionQuery(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	b, _ := policy.Load(policy.Default())
	full := prepareQuery(t, b, authz.DecisionQuery)
	ctx := context.Background()
	var ins []*authz.Input
	connect := connectInput(oneNS("internal", "ro"))
	for _, f := range []func(r map[string]any){
		func(map[string]any) {},
		func(r map[string]any) { delete(r, "job") },
		func(r map[string]any) { r["job"] = "j1" },
		func(r map[string]any) { ns0(r)["nsid"] = "1" },
		func(r map[string]any) { r["namespaces"] = map[string]any{"0": 1} },
		func(r map[string]any) { obj(r, "job")["expires_at"] = "soon" },
		func(r map[string]any) { obj(r, "job")["nodes"] = []any{node2ID} },
		func(r map[string]any) { obj(r, "subsystem")["tls"] = "yes" },
		func(r map[string]any) { r["request"] = []any{} },
		func(r map[string]any) { obj(r, "request")["mode"] = "rw"; ns0(r)["data_class"] = "immutable" },
		func(r map[string]any) { r["extra"] = map[string]any{"b": 1, "a": []any{true, nil, 1.5}} },
		func(r map[string]any) { ns0(r)["extra"] = "x" },
		func(r map[string]any) {
			for k := range r {
				r[k] = nil
			}
		},
	} {
		ins = append(ins, with(connect, f))
	}
	ins = append(ins, call(nodeID, "/nvmegate.v1.Access/Renew", connect.Resource), connectAs(adminID, connect), call(nodeID, "/nvmegate.v1.Access/Connect", nil))
	r := rand.New(rand.NewPCG(7, 7))
	for len(ins) < 400 {
		in, _ := newWorld(r).request()
		if in.Action == "access.connect" || in.Action == "access.renew" {
			ins = append(ins, in)
		}
	}
	var typed int
	for i, in := range ins {
		if _, ok := in.Resource["target"].(map[string]any); ok { // the gateway's targets have a driver
			in.Resource["target"].(map[string]any)["driver"] = "nvmet"
		}
		d, err := e.Authorize(ctx, in)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		want := evalDecision(t, full, in)
		if d.Allow != want.Allow || !slices.Equal(d.Reasons, want.Reasons) || d.Obligations != want.Obligations {
			raw, _ := json.Marshal(in.Resource)
			t.Fatalf("%d: engine %+v\n%s %+v\nresource %s", i, d, authz.DecisionQuery, want, raw)
		}
		if s, err := authz.ScopeFromResource(in.Resource); err == nil {
			typed++
			ti := *in
			ti.Resource, ti.Scope = nil, s
			td, err := e.Authorize(ctx, &ti)
			if err != nil || td.Allow != d.Allow || !slices.Equal(td.Reasons, d.Reasons) || td.Obligations != d.Obligations {
				t.Fatalf("%d: with a typed scope %+v, %v; without %+v", i, td, err, d)
			}
		}
	}
	if typed < 100 {
		t.Errorf("only %d inputs had a typed scope", typed)
	}
}

// TestTypedDecidesAsTheMap: a connect or renew whose resource is typed
// (Input.Scope, no map) is decided as the same resource given as a map,
// allow, reasons and obligations, for every kind of scope: the caller a
// member of the job or not, bound or not or bound to another tenant, the
// job, subsystem, target or a namespace missing from the inventory, records
// of other tenants, modes ro and rw, a job expired or finished, other
// callers' roles. By the split engine (scope and caller decisions
// memoized, so each input is decided cold and then warm), and by an engine
// whose policy decides these actions whole (no split_actions) and answers
// with the resource it sees, which must be the map's key for key.
func TestTypedDecidesAsTheMap(t *testing.T) {
	split, _, _ := newEngine(t, nil)
	whole, _, _ := newEngine(t, bundle(t, map[string]string{"mirror.rego": `package nvmegate.authz
decision := {"allow": object.get(input.resource, "deny", false) == false, "reasons": [json.marshal(input.resource)], "obligations": {}}
`}, allowSample(`{"resource": {}}`), denySample(`{"resource": {"deny": true}}`)))
	ctx := context.Background()

	connect := connectInput(benchNamespaces(3, "ro"))
	connect.Resource["kind"] = "job"
	obj(connect.Resource, "job")["nodes"] = []any{nodeID} // the gateway narrows nodes to the caller
	variants := map[string]func(r map[string]any){
		"allowed":         func(map[string]any) {},
		"not a member":    func(r map[string]any) { obj(r, "job")["nodes"] = []any{} },
		"unbound":         func(r map[string]any) { obj(r, "host_binding")["bound"], obj(r, "host_binding")["tenant"] = false, "" },
		"bound to globex": func(r map[string]any) { obj(r, "host_binding")["tenant"] = "globex" },
		"no job":          func(r map[string]any) { r["job"], r["tenant"] = map[string]any{"job_id": "j1"}, "" },
		"globex's job":    func(r map[string]any) { obj(r, "job")["tenant"], r["tenant"] = "globex", "globex" },
		"job expired": func(r map[string]any) {
			obj(r, "job")["expires_at"] = epoch.Add(-time.Second).UTC().Format(time.RFC3339Nano)
		},
		"job finished":       func(r map[string]any) { obj(r, "job")["state"] = "finished" },
		"no subsystem":       func(r map[string]any) { r["subsystem"] = map[string]any{"nqn": subNQN}; delete(r, "target") },
		"globex's subsystem": func(r map[string]any) { obj(r, "subsystem")["tenant"] = "globex" },
		"no target":          func(r map[string]any) { delete(r, "target") },
		"unplaced namespace": func(r map[string]any) { delete(ns0(r), "target") },
		"namespace not found": func(r map[string]any) {
			r["namespaces"].([]any)[1] = map[string]any{"subsystem_nqn": subNQN, "nsid": int64(2), "mode": "ro"}
		},
		"globex's namespace":    func(r map[string]any) { ns0(r)["tenant"] = "globex" },
		"namespace not in job":  func(r map[string]any) { ns0(r)["mode"] = "" },
		"rw":                    func(r map[string]any) { ns0(r)["mode"] = "rw" },
		"rw immutable":          func(r map[string]any) { ns0(r)["mode"], ns0(r)["data_class"] = "rw", "immutable" },
		"request rw":            func(r map[string]any) { obj(r, "request")["mode"] = "rw" },
		"out of region":         func(r map[string]any) { ns0(r)["region"] = "us-east" },
		"requested host NQN":    func(r map[string]any) { obj(r, "request")["host_nqn"] = "nqn.2014-08.org.nvmexpress:uuid:other" },
		"no TTL":                func(r map[string]any) { obj(r, "request")["ttl"] = "" },
		"job allows no regions": func(r map[string]any) { obj(r, "job")["allowed_regions"] = []any{} },
	}
	var ins []*authz.Input
	for _, name := range slices.Sorted(maps.Keys(variants)) {
		in := with(connect, variants[name])
		ins = append(ins, in, connectAs(node2ID, in), connectAs(schedulerID, in), connectAs(adminID, in),
			connectAs(nodeID, in, "/nvmegate.v1.Access/Renew"))
	}
	r := rand.New(rand.NewPCG(17, 19))
	for len(ins) < 600 {
		in, _ := newWorld(r).request()
		if in.Action != "access.connect" && in.Action != "access.renew" {
			continue
		}
		if tg, ok := in.Resource["target"].(map[string]any); ok {
			tg["driver"] = "nvmet" // the gateway's targets have a driver
		}
		if _, err := authz.ScopeFromResource(in.Resource); err == nil { // not an admin's {"kind": "none"}
			ins = append(ins, in)
		}
	}
	allowed := 0
	for i, in := range ins {
		s, err := authz.ScopeFromResource(in.Resource)
		if err != nil {
			raw, _ := json.Marshal(in.Resource)
			t.Fatalf("%d: no typed scope: %v\n%s", i, err, raw)
		}
		ti := *in
		ti.Resource, ti.Scope = nil, s
		sealed := ti // the scope part hashed once (Scope.Sealed)
		sealed.Scope = s.Sealed()
		for _, e := range []*authz.Engine{split, whole} {
			for range 2 { // cold, then warm
				want, err := e.Authorize(ctx, in)
				if err != nil {
					t.Fatal(err)
				}
				got, err := e.Authorize(ctx, &ti)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allow != want.Allow || !slices.Equal(got.Reasons, want.Reasons) || got.Obligations != want.Obligations {
					raw, _ := json.Marshal(in.Resource)
					t.Fatalf("%d (split %t): typed %+v\nmap %+v\nresource %s", i, e == split, got, want, raw)
				}
				got, err = e.Authorize(ctx, &sealed)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allow != want.Allow || !slices.Equal(got.Reasons, want.Reasons) || got.Obligations != want.Obligations {
					raw, _ := json.Marshal(in.Resource)
					t.Fatalf("%d (split %t): sealed %+v\nmap %+v\nresource %s", i, e == split, got, want, raw)
				}
				if got.Allow && e == split {
					allowed++
				}
			}
		}
	}
	if allowed < 100 || allowed > 2*len(ins)-100 {
		t.Errorf("%d of %d split decisions allowed: the cases do not vary", allowed, 2*len(ins))
	}
}

// TestSealedScopeSharedByCallers: the gateway seals a job's scope once and
// gives every node's call a copy with its own caller fields. Each copy is
// decided as that caller's own unsealed scope — a member, a node not in
// the job, an unbound node, a node bound to another tenant, whatever order
// they come in (the memo must not hand one caller's answer to another) —
// and a sealed scope part is not the same key as a different one: a
// namespace moved out of the job's regions is refused though a sealed
// scope of the original was decided first. Sealing copies: changing the
// scope it was made from changes nothing sealed.
func TestSealedScopeSharedByCallers(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	ctx := context.Background()
	connect := connectInput(benchNamespaces(3, "ro"))
	connect.Resource["kind"] = "job"
	obj(connect.Resource, "job")["nodes"] = []any{nodeID}
	base, err := authz.ScopeFromResource(connect.Resource)
	if err != nil {
		t.Fatal(err)
	}
	template := base.Sealed()
	callers := map[string]func(s *authz.Scope){
		"member":           func(*authz.Scope) {},
		"not a member":     func(s *authz.Scope) { s.Job.Nodes = nil },
		"unbound":          func(s *authz.Scope) { s.Binding.Bound, s.Binding.Tenant = false, "" },
		"bound to globex":  func(s *authz.Scope) { s.Binding.Tenant = "globex" },
		"another host NQN": func(s *authz.Scope) { s.Request.HostNQN = "nqn.2014-08.org.nvmexpress:uuid:other" },
	}
	names := slices.Sorted(maps.Keys(callers))
	reversed := slices.Clone(names)
	slices.Reverse(reversed)
	for _, order := range [][]string{names, reversed} {
		for _, name := range order {
			sealed, plain := *template, *base
			callers[name](&sealed)
			callers[name](&plain)
			in := *connect
			in.Resource, in.Scope = nil, &plain
			want, err := e.Authorize(ctx, &in)
			if err != nil {
				t.Fatal(err)
			}
			in.Scope = &sealed
			got, err := e.Authorize(ctx, &in)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allow != want.Allow || !slices.Equal(got.Reasons, want.Reasons) || got.Obligations != want.Obligations {
				t.Fatalf("%s: sealed %+v, unsealed %+v", name, got, want)
			}
			if got.Allow != (name == "member" || name == "unbound") { // the default binding is the node's own
				t.Fatalf("%s: %+v", name, got)
			}
		}
	}

	moved := *base
	moved.Namespaces = slices.Clone(base.Namespaces)
	moved.Namespaces[0].Region = "us-east"
	in := *connect
	in.Resource, in.Scope = nil, moved.Sealed()
	if d, err := e.Authorize(ctx, &in); err != nil || d.Allow {
		t.Fatalf("a namespace out of the job's regions, sealed after the original: %+v, %v", d, err)
	}
	base.Namespaces[0].Region = "us-east" // the sealed template keeps its own copy
	in.Scope = template
	if d, err := e.Authorize(ctx, &in); err != nil || !d.Allow {
		t.Fatalf("the template after its source changed: %+v, %v", d, err)
	}
}

// evalDecision evaluates a prepared DecisionQuery on the input document
// the engine builds from in (example.org's gateway, in's time).
func evalDecision(t *testing.T, q rego.PreparedEvalQuery, in *authz.Input) nvmegate.Decision {
	t.Helper()
	doc := *in
	doc.Gateway = authz.Gateway{TrustDomain: "example.org"}
	doc.Time = in.Time.UTC()
	if doc.Action == "" {
		doc.Action = authz.ActionFromMethod(doc.RPC.FullMethod)
	}
	if doc.Resource == nil {
		doc.Resource = map[string]any{}
	}
	raw, _ := json.Marshal(doc)
	v, err := ast.ValueFromReader(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := q.Eval(context.Background(), rego.EvalParsedInput(v))
	if err != nil || len(rs) != 1 {
		t.Fatalf("%v %v", rs, err)
	}
	var out struct {
		Allow       bool           `json:"allow"`
		Reasons     []string       `json:"reasons"`
		Obligations map[string]any `json:"obligations"`
	}
	j, _ := json.Marshal(rs[0].Expressions[0].Value)
	if err := json.Unmarshal(j, &out); err != nil {
		t.Fatal(err)
	}
	d := nvmegate.Decision{Allow: out.Allow, Reasons: out.Reasons}
	if out.Allow {
		ob := out.Obligations
		if s, ok := ob["max_ttl"].(string); ok {
			d.Obligations.MaxTTL, _ = time.ParseDuration(s)
		}
		d.Obligations.RequireTLS, _ = ob["require_tls"].(bool)
		d.Obligations.Bidirectional, _ = ob["bidirectional"].(bool)
		d.Obligations.ReadOnly, _ = ob["read_only"].(bool)
		d.Obligations.AuthMode, _ = ob["auth_mode"].(string)
		d.Obligations.MinHash, _ = ob["min_hash"].(string)
		d.Obligations.MinDHGroup, _ = ob["min_dh_group"].(string)
		if n, ok := ob["max_iops"].(float64); ok {
			d.Obligations.MaxIOPS = uint64(n)
		}
		if n, ok := ob["max_mbps"].(float64); ok {
			d.Obligations.MaxMBps = uint64(n)
		}
	}
	return d
}

// TestSelfTestHoldsPartsToDecisionQuery: a policy whose Rego composition
// of the parts (DecisionQuery) would decide a sample otherwise than the
// engine's parts does not load.
func TestSelfTestHoldsPartsToDecisionQuery(t *testing.T) {
	embedded, _ := policy.Load(policy.Default())
	fsys := copyFS(t, embedded)
	src := string(mustRead(t, fsys, "connect.rego"))
	old := `["tenant", "target", "subsystem", "namespaces"]`
	if !strings.Contains(src, old) {
		t.Fatal("connect.rego changed")
	}
	fsys["connect.rego"] = &fstest.MapFile{Data: []byte(strings.Replace(src, old, `["tenant", "target", "subsystem"]`, 1))}
	b, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	_, err = authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: b})
	var ste *authz.SelfTestError
	if !errors.As(err, &ste) || !strings.Contains(err.Error(), "differs from "+authz.DecisionQuery) {
		t.Errorf("NewEngine: %v, want a self-test error: the split decision differs", err)
	}
}

// TestExplainShowsTheParts: Explain of a connect shows the scope input and
// the three decisions; of another action, the decision document alone.
func TestExplainShowsTheParts(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	b, _ := policy.Load(policy.Default())
	var input map[string]any
	for _, s := range b.Samples {
		if s.Name == "node may not connect where the target breaks residency" {
			json.Unmarshal(s.Input, &input)
		}
	}
	d, raw, err := e.Explain(context.Background(), input, nil)
	if err != nil || d.Allow {
		t.Fatalf("%+v %v", d, err)
	}
	var doc struct {
		Allow   bool     `json:"allow"`
		Reasons []string `json:"reasons"`
		Parts   struct {
			ScopeInput     map[string]any `json:"scope_input"`
			ScopeDecision  map[string]any `json:"scope_decision"`
			CallerDecision map[string]any `json:"caller_decision"`
			NodeDecision   map[string]any `json:"node_decision"`
		} `json:"parts"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	want := "namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-east"
	p := doc.Parts
	if !slices.Equal(doc.Reasons, []string{want}) || !slices.Equal(d.Reasons, doc.Reasons) ||
		p.ScopeDecision["allow"] != false || p.CallerDecision["allow"] != false || p.NodeDecision["allow"] != false ||
		p.ScopeInput["action"] != "access.connect" || p.ScopeInput["resource"].(map[string]any)["host_binding"] != nil {
		t.Errorf("explanation:\n%s", raw)
	}
	if _, raw, _ := e.Explain(context.Background(), map[string]any{"action": "inventory.add_target"}, nil); strings.Contains(string(raw), "parts") {
		t.Errorf("parts for a whole decision: %s", raw)
	}
}

// TestSplitConcurrent decides connects of many nodes at once, some
// repeated, some changed, while revisions are swapped: every decision is
// the one its revision makes of its input.
func TestSplitConcurrent(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	embedded, _ := policy.Load(policy.Default())
	fsys := copyFS(t, embedded)
	fsys["data.json"] = &fstest.MapFile{Data: []byte(strings.Replace(string(mustRead(t, fsys, "data.json")),
		`"internal": {"max_ttl": "24h"}`, `"internal": {"max_ttl": "12h"}`, 1))}
	short, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	ttl := map[string]time.Duration{embedded.Revision: 24 * time.Hour, short.Revision: 12 * time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ctx.Err() == nil; i++ {
			b := embedded
			if i%2 == 0 {
				b = short
			}
			if err := e.Reload(ctx, b, "x"); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
	}()
	errs := make(chan error, 8)
	for g := range 8 {
		go func() {
			for i := range 100 {
				id := fmt.Sprintf("spiffe://example.org/node/n%d", (g*7+i)%12)
				in := connectInput(oneNS("internal", "ro"))
				in = call(id, in.RPC.FullMethod, in.Resource)
				in.Resource["job"].(map[string]any)["nodes"] = []any{id}
				in.Resource["host_binding"] = bindingRec(id, "nqn.2014-08.org.nvmexpress:uuid:x"+id, "acme", true)
				in.Resource["request"] = map[string]any{"host_nqn": "", "mode": ""}
				wantAllow := i%5 != 0
				if !wantAllow {
					ns0(in.Resource)["region"] = "us-east"
				}
				d, err := e.Authorize(context.Background(), in)
				if err == nil && (d.Allow != wantAllow || d.Allow && d.Obligations.MaxTTL != ttl[d.PolicyRevision]) {
					err = fmt.Errorf("%s: %+v", id, d)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	cancel()
	<-done
}
