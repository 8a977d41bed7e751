package authz_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// A random inventory: tenants, targets in regions, subsystems with
// namespaces of random classes, nodes with random bindings. Names carry no
// tenant, so that a reason naming a tenant is a leak.
type world struct {
	r          *rand.Rand
	tenants    []string
	regions    []string
	classes    []string
	targets    []map[string]any
	subsystems []*propSubsystem
	nodes      []string
	bindings   map[string]map[string]any
}

type propSubsystem struct {
	rec        map[string]any
	namespaces []map[string]any
}

func newWorld(r *rand.Rand) *world {
	w := &world{
		r:        r,
		tenants:  []string{"acme", "globex", "initech", "umbrella"},
		regions:  []string{"eu-west", "eu-central", "eu-sovereign", "us-east", "us-west", "ap-south"},
		classes:  []string{"public", "internal", "restricted", "immutable"},
		bindings: map[string]map[string]any{},
	}
	fabrics := []string{"f1", "f2", "sovereign-1"}
	for i := range 8 {
		w.targets = append(w.targets, map[string]any{"id": fmt.Sprintf("t%d", i), "region": w.pick(w.regions), "fabric": w.pick(fabrics)})
	}
	for i := range 10 {
		tenant := w.pick(w.tenants)
		tgt := w.targets[r.IntN(len(w.targets))]
		nqn := fmt.Sprintf("nqn.2026-01.org.example:s%d", i)
		s := &propSubsystem{rec: map[string]any{
			"nqn": nqn, "tenant": tenant, "target_id": tgt["id"], "dhchap": r.IntN(4) != 0, "tls": r.IntN(3) != 0,
		}}
		for j := range 1 + r.IntN(4) {
			region := tgt["region"].(string)
			if r.IntN(4) == 0 {
				region = w.pick(w.regions)
			}
			nsTenant := tenant
			if r.IntN(12) == 0 { // an inconsistent inventory: policy must still isolate
				nsTenant = w.pick(w.tenants)
			}
			s.namespaces = append(s.namespaces, map[string]any{
				"subsystem_nqn": nqn, "nsid": j + 1, "tenant": nsTenant, "region": region, "data_class": w.pick(w.classes),
				"dataset": map[string]any{"name": fmt.Sprintf("ds/%d/%d", i, j), "digest": fmt.Sprintf("sha256:%064x", i*16+j)},
				"qos":     map[string]any{"max_iops": uint64(r.IntN(3) * 1000), "max_mbps": uint64(r.IntN(2) * 500)},
				"target":  map[string]any{"id": tgt["id"], "region": tgt["region"], "fabric": tgt["fabric"]},
			})
		}
		w.subsystems = append(w.subsystems, s)
	}
	for i := range 6 {
		id := fmt.Sprintf("spiffe://example.org/node/n%d", i)
		w.nodes = append(w.nodes, id)
		b := map[string]any{"spiffe_id": id, "host_nqn": fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-5000-8000-000000000000", i), "tenant": "", "bound": false}
		switch r.IntN(6) {
		case 0:
			b["bound"], b["tenant"] = true, w.pick(w.tenants)
		case 1:
			b["bound"] = true
		}
		w.bindings[id] = b
	}
	return w
}

func (w *world) pick(s []string) string { return s[w.r.IntN(len(s))] }

// regionsFor: the regions of the namespaces, sometimes one short, sometimes
// one more.
func (w *world) regionsFor(nss []map[string]any) []any {
	var out []any
	for _, ns := range nss {
		if w.r.IntN(8) != 0 && !slices.Contains(out, ns["region"]) {
			out = append(out, ns["region"])
		}
	}
	if len(out) == 0 || w.r.IntN(4) == 0 {
		out = append(out, w.pick(w.regions))
	}
	return out
}

func (w *world) job(tenant string, nodes []string, nss []map[string]any) map[string]any {
	state := "active"
	if w.r.IntN(10) == 0 {
		state = w.pick([]string{"finished", "expired"})
	}
	exp := epoch.Add(time.Duration(w.r.IntN(48)-4) * time.Hour)
	return map[string]any{
		"job_id": fmt.Sprintf("job-%d", w.r.IntN(1000)), "tenant": tenant,
		"scheduler": "spiffe://example.org/tenant/" + tenant + "/scheduler/s", "nodes": anys(nodes),
		"allowed_regions": w.regionsFor(nss), "expires_at": exp.Format(time.RFC3339Nano), "state": state,
	}
}

func (w *world) someNodes(must string) []string {
	var out []string
	for _, n := range w.nodes {
		if n == must || w.r.IntN(3) == 0 {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		out = append(out, w.nodes[0])
	}
	return out
}

func withMode(ns map[string]any, mode string) map[string]any {
	out := deepCopy(ns).(map[string]any)
	out["mode"] = mode
	return out
}

func (w *world) mode() string { return []string{"ro", "ro", "rw", "rw", ""}[w.r.IntN(5)] }

// propCaller says who asks: the property to check depends on it.
type propCaller struct {
	id, role, tenant string
}

// request draws one request: a node access call, a scheduler admission or
// read, or an admin or auditor call.
func (w *world) request() (*authz.Input, propCaller) {
	switch k := w.r.IntN(10); {
	case k < 5: // a node's access call for a job
		node := w.pick(w.nodes)
		s := w.subsystems[w.r.IntN(len(w.subsystems))]
		tenant := s.rec["tenant"].(string)
		if w.r.IntN(5) == 0 {
			tenant = w.pick(w.tenants)
		}
		var nss []map[string]any
		for _, ns := range s.namespaces {
			nss = append(nss, withMode(ns, w.mode()))
		}
		jobNodes := w.someNodes(node)
		if w.r.IntN(6) == 0 {
			jobNodes = slices.DeleteFunc(jobNodes, func(n string) bool { return n == node })
		}
		job := w.job(tenant, jobNodes, nss)
		method := w.pick([]string{"Connect", "Connect", "Renew", "Discover", "Release"})
		res := map[string]any{
			"kind": "subsystem", "tenant": tenant, "job": job,
			"host_binding": deepCopy(w.bindings[node]),
			"request":      map[string]any{"host_nqn": "", "ttl": "", "mode": ""},
		}
		if method == "Connect" || method == "Renew" {
			res["subsystem"] = deepCopy(s.rec)
			res["target"] = deepCopy(w.targets[0])
		}
		if method != "Release" {
			res["namespaces"] = anys(nss)
		}
		if w.r.IntN(10) == 0 {
			res["request"].(map[string]any)["mode"] = "rw"
		}
		return call(node, "/nvmegate.v1.Access/"+method, res), propCaller{node, "node", ""}
	case k < 8: // a scheduler admits a job
		tenant := w.pick(w.tenants)
		jobTenant := tenant
		if w.r.IntN(5) == 0 {
			jobTenant = w.pick(w.tenants)
		}
		var nss []map[string]any
		for range 1 + w.r.IntN(4) {
			s := w.subsystems[w.r.IntN(len(w.subsystems))]
			for s.rec["tenant"] != jobTenant && w.r.IntN(4) != 0 {
				s = w.subsystems[w.r.IntN(len(w.subsystems))]
			}
			nss = append(nss, withMode(s.namespaces[w.r.IntN(len(s.namespaces))], w.pick([]string{"ro", "rw"})))
		}
		jobNodes := w.someNodes(w.pick(w.nodes))
		var bindings []any
		for _, n := range jobNodes {
			bindings = append(bindings, deepCopy(w.bindings[n]))
		}
		id := "spiffe://example.org/tenant/" + tenant + "/scheduler/s"
		return call(id, "/nvmegate.v1.Jobs/Admit", map[string]any{
			"kind": "job", "tenant": jobTenant, "job": w.job(jobTenant, jobNodes, nss), "nodes": bindings, "namespaces": anys(nss),
		}), propCaller{id, "scheduler", tenant}
	case k < 9: // a scheduler reads a namespace
		tenant := w.pick(w.tenants)
		s := w.subsystems[w.r.IntN(len(w.subsystems))]
		ns := s.namespaces[w.r.IntN(len(s.namespaces))]
		id := "spiffe://example.org/tenant/" + tenant + "/scheduler/s"
		return call(id, "/nvmegate.v1.Inventory/GetNamespace", map[string]any{
			"kind": "namespace", "tenant": ns["tenant"], "subsystem": deepCopy(s.rec), "namespaces": []any{withMode(ns, "")},
		}), propCaller{id, "scheduler", tenant}
	default:
		id := w.pick([]string{adminID, auditorID})
		m := w.pick([]string{"/nvmegate.v1.Audit/Query", "/nvmegate.v1.Inventory/GetNamespace", "/nvmegate.v1.Jobs/Admit", "/nvmegate.v1.Access/Connect"})
		return call(id, m, map[string]any{"kind": "none", "tenant": w.pick(w.tenants)}), propCaller{id, strings.Split(id, "/")[3], ""}
	}
}

// fence is data.nvmegate.residency[region], or the region alone.
type fence struct{ targets, fabrics []string }

func fences(t *testing.T, b *policy.Bundle) func(region string) fence {
	raw, _ := json.Marshal(b.Data["nvmegate"].(map[string]any)["residency"])
	var m map[string]struct {
		TargetRegions []string `json:"target_regions"`
		Fabrics       []string `json:"fabrics"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return func(region string) fence {
		f, ok := m[region]
		if !ok || f.TargetRegions == nil {
			return fence{targets: []string{region}, fabrics: f.Fabrics}
		}
		return fence{targets: f.TargetRegions, fabrics: f.Fabrics}
	}
}

// TestPropertyDecisions draws thousands of requests over random
// inventories and checks, for every decision, that
//
//   - a caller of tenant A is never allowed anything on tenant B's
//     resources (schedulers by their SPIFFE ID, nodes by their binding and
//     the job's tenant);
//   - a residency violation is never allowed;
//   - an immutable namespace is never allowed rw;
//   - a deny names no tenant but the caller's own, and always has a
//     specific reason;
//   - the policy's fast path agrees with its reasons: an allowed request
//     has no problems, a denied one that the role may make has some.
func TestPropertyDecisions(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	fenceOf := fences(t, b)
	problems := prepareQuery(t, b, "data.nvmegate.authz.problems")
	ctx := context.Background()
	n := 1500
	if testing.Short() {
		n = 300
	}
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, 0x6e766d6567617465))
		var allows, denies int
		allowedBy := map[string]int{}
		for i := range n {
			w := newWorld(r)
			in, c := w.request()
			d, err := e.Authorize(ctx, in)
			if err != nil {
				t.Fatalf("seed %d case %d: %v", seed, i, err)
			}
			fail := func(format string, args ...any) {
				t.Helper()
				raw, _ := json.Marshal(in.Resource)
				t.Fatalf("seed %d case %d: %s %s: %s\ndecision %+v\nresource %s", seed, i, c.id, in.Action, fmt.Sprintf(format, args...), d, raw)
			}
			if d.Allow {
				allows++
				allowedBy[in.Action]++
				checkAllowed(in, c, d, fenceOf, fail)
			} else {
				denies++
				for _, reason := range d.Reasons {
					if strings.Contains(reason, "outside the scope") || strings.HasPrefix(reason, "policy ") {
						fail("deny without a specific reason")
					}
					for _, tn := range w.tenants {
						if tn != c.tenant && strings.Contains(reason, tn) {
							fail("reason %q names tenant %s", reason, tn)
						}
					}
				}
			}
			ps := evalSet(t, problems, in)
			if d.Allow && len(ps) > 0 {
				fail("allowed, but the policy's reasons are %q", ps)
			}
		}
		t.Logf("seed %d: %d allowed %v, %d denied", seed, allows, allowedBy, denies)
		for _, a := range []string{"access.connect", "access.discover", "jobs.admit", "inventory.get_namespace"} {
			if !testing.Short() && allowedBy[a] < 10 {
				t.Errorf("seed %d: %d allowed %s: the generator no longer explores allows", seed, allowedBy[a], a)
			}
		}
		if denies < n/10 {
			t.Errorf("seed %d: %d denies", seed, denies)
		}
	}
}

func checkAllowed(in *authz.Input, c propCaller, d *nvmegate.Decision, fenceOf func(string) fence, fail func(string, ...any)) {
	res := in.Resource
	str := func(v any) string { s, _ := v.(string); return s }
	job, _ := res["job"].(map[string]any)
	nss, _ := res["namespaces"].([]any)
	sub, _ := res["subsystem"].(map[string]any)

	// The tenant the request may concern.
	var tenant string
	switch c.role {
	case "scheduler":
		tenant = c.tenant
		if str(res["tenant"]) != tenant {
			fail("scheduler of %s allowed on resource of tenant %q", tenant, res["tenant"])
		}
		if job != nil && str(job["tenant"]) != tenant {
			fail("scheduler of %s allowed on a job of %v", tenant, job["tenant"])
		}
		nodes, _ := res["nodes"].([]any)
		for _, n := range nodes {
			if bt := str(n.(map[string]any)["tenant"]); bt != "" && bt != tenant {
				fail("scheduler of %s admitted a node bound to %s", tenant, bt)
			}
		}
	case "node":
		tenant = str(job["tenant"])
		b := res["host_binding"].(map[string]any)
		if bt := str(b["tenant"]); bt != "" && bt != tenant {
			fail("node bound to %s allowed for a job of %s", bt, tenant)
		}
		if !slices.Contains(job["nodes"].([]any), any(c.id)) || job["state"] != "active" {
			fail("node allowed outside an active job naming it")
		}
		exp, _ := time.Parse(time.RFC3339Nano, str(job["expires_at"]))
		if !exp.After(in.Time) {
			fail("node allowed in an expired job")
		}
	default:
		if len(d.Reasons) != 1 || !strings.HasPrefix(d.Reasons[0], "role "+c.role+" may perform ") {
			fail("unexpected allow")
		}
		return
	}
	if sub != nil && str(sub["tenant"]) != tenant {
		fail("allowed on subsystem of %v for tenant %s", sub["tenant"], tenant)
	}
	for _, x := range nss {
		ns := x.(map[string]any)
		if str(ns["tenant"]) != tenant {
			fail("allowed on namespace of %v for tenant %s", ns["tenant"], tenant)
		}
		if ns["data_class"] == "immutable" && (ns["mode"] == "rw" || res["request"] != nil && res["request"].(map[string]any)["mode"] == "rw") {
			fail("immutable namespace allowed rw")
		}
		if in.Action == "inventory.get_namespace" || in.Action == "access.release" {
			continue
		}
		region := str(ns["region"])
		if !slices.Contains(job["allowed_regions"].([]any), any(region)) {
			fail("namespace in region %s outside the job's regions %v", region, job["allowed_regions"])
		}
		tgt := ns["target"].(map[string]any)
		f := fenceOf(region)
		if !slices.Contains(f.targets, str(tgt["region"])) || (f.fabrics != nil && !slices.Contains(f.fabrics, str(tgt["fabric"]))) {
			fail("namespace of %s served from %s/%s", region, tgt["region"], tgt["fabric"])
		}
	}
}

// prepareQuery prepares query over b's modules and data (without the
// engine's derived table: the rules compute per request what it holds).
func prepareQuery(t *testing.T, b *policy.Bundle, query string) rego.PreparedEvalQuery {
	t.Helper()
	opts := []func(*rego.Rego){
		rego.Query(query), rego.SetRegoVersion(ast.RegoV1), rego.StrictBuiltinErrors(true),
		rego.Store(inmem.NewFromObject(b.Data)),
	}
	for _, m := range b.Modules {
		opts = append(opts, rego.Module(m.Name, m.Source))
	}
	q, err := rego.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// evalSet evaluates a set-valued query on the input document the engine
// builds from in.
func evalSet(t *testing.T, q rego.PreparedEvalQuery, in *authz.Input) []string {
	t.Helper()
	doc := *in
	doc.Gateway = authz.Gateway{TrustDomain: "example.org"}
	doc.Time = in.Time.UTC()
	raw, _ := json.Marshal(doc)
	var v map[string]any
	json.Unmarshal(raw, &v)
	rs, err := q.Eval(context.Background(), rego.EvalInput(v))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	if len(rs) > 0 {
		for _, x := range rs[0].Expressions[0].Value.([]any) {
			out = append(out, x.(string))
		}
	}
	return out
}
