package authz_test

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// BenchmarkDecision measures Engine.Authorize (input conversion, prepared
// query evaluation, decision parsing) for the hot decisions: a node's
// connect and a scheduler's admit, each naming 8 namespaces, with the
// default policy's data, and with that data plus 10,000 namespaces and
// 1,000 jobs keyed by ID (which the policy never reads: the data's size
// must not slow decisions). Besides ns/op it reports the 99th percentile
// of the per-decision durations as p99-ns.
//
//	go test ./authz/ -run '^$' -bench BenchmarkDecision -benchtime 20000x
func BenchmarkDecision(b *testing.B) {
	for _, data := range []struct {
		name  string
		extra int
	}{{"default-data", 0}, {"data-10k-namespaces-1k-jobs", 10000}} {
		e, _, _ := newEngine(b, bigBundle(b, data.extra))
		for _, bc := range []struct {
			name string
			in   *authz.Input
		}{
			{"node-connect-8ns", connectInput(benchNamespaces(8, "ro"))},
			{"node-connect-1ns", connectInput(benchNamespaces(1, "ro"))},
			{"scheduler-admit-8ns", admitInput(benchNamespaces(8, "rw"))},
		} {
			b.Run(data.name+"/"+bc.name, func(b *testing.B) {
				ctx := context.Background()
				if d, err := e.Authorize(ctx, bc.in); err != nil || !d.Allow {
					b.Fatalf("%+v, %v", d, err)
				}
				durs := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					t0 := time.Now()
					d, err := e.Authorize(ctx, bc.in)
					durs = append(durs, time.Since(t0))
					if err != nil || !d.Allow {
						b.Fatal(d, err)
					}
				}
				b.StopTimer()
				slices.Sort(durs)
				b.ReportMetric(float64(durs[len(durs)*99/100].Nanoseconds()), "p99-ns")
			})
		}
	}
}

// bigBundle is the embedded bundle with, when n > 0, n namespaces and n/10
// jobs added to data.nvmegate (as a site that keeps its inventory in policy
// data would have them).
func bigBundle(t testing.TB, n int) *policy.Bundle {
	t.Helper()
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return b
	}
	nss := make(map[string]any, n)
	for i := range n {
		nss[fmt.Sprintf("nqn.2026-01.org.example:s%d/%d", i/16, i%16+1)] = map[string]any{
			"tenant": fmt.Sprintf("t%d", i%50), "region": "eu-west", "data_class": "internal",
			"dataset": map[string]any{"name": fmt.Sprintf("ds/%d", i), "digest": fmt.Sprintf("sha256:%064x", i)},
		}
	}
	jobs := make(map[string]any, n/10)
	for i := range n / 10 {
		jobs[fmt.Sprintf("job-%d", i)] = map[string]any{
			"tenant": fmt.Sprintf("t%d", i%50), "nodes": []any{fmt.Sprintf("spiffe://example.org/node/n%d", i)},
			"allowed_regions": []any{"eu-west"}, "state": "active",
		}
	}
	// data.nvmegate.inventory: a second data file, merged under the first's root.
	fsys := copyFS(t, b)
	fsys["nvmegate/inventory/data.json"] = jsonFile(t, map[string]any{"namespaces": nss, "jobs": jobs})
	big, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return big
}

// BenchmarkConnect measures a node's 8-namespace connect decision through
// Engine.Authorize as the gateway makes it under load, against OPA's floor
// measured in the same run:
//
//	floor       a prepared query of the constant rule x := true, evaluated
//	            with an ast.Value input (rego.EvalParsedInput): the least a
//	            decision evaluated by OPA costs
//	warm        the same job and subsystem, 256 node callers in turn: the
//	            scope and caller decisions memoized, the node decision
//	            evaluated (what every connect but a node's first costs)
//	warm-typed  the same with the resource typed (Input.Scope, no map)
//	warm-sealed the same with the scope part sealed once (Scope.Sealed)
//	            and each caller a copy, as the gateway hands it over:
//	            the decision the target is measured on
//	cold        every call another job: every part decided (a memo miss)
//
// Each sub-benchmark but floor evaluates the floor right after each
// decision, so that both see the same machine (other work on a shared
// machine moves either by more than the difference), and reports the
// decision's ns/op (its mean) and p99-ns, its decision-allocs/op and
// decision-B/op (over a pass without the floor; allocs/op and B/op count
// the floor's too), the floor's floor-ns and floor-p99-ns, and the ratios
// x-floor (means) and p99-x-floor.
//
//	go test ./authz/ -run '^$' -bench BenchmarkConnect -benchtime 20000x
//
// stormNode numbers the new callers of BenchmarkConnect/new-caller: every
// call, across -count runs too, is a node the memo has not seen.
var stormNode atomic.Int64

func BenchmarkConnect(b *testing.B) {
	ctx := context.Background()
	q, err := rego.New(rego.Query("data.floor.x"), rego.Module("floor.rego", "package floor\nx := true\n"),
		rego.Store(inmem.NewFromObject(map[string]any{}))).PrepareForEval(ctx)
	if err != nil {
		b.Fatal(err)
	}
	floorIn, err := ast.InterfaceToValue(map[string]any{"caller": map[string]any{"id": nodeID}, "action": "access.connect", "time": epoch.Format(time.RFC3339)})
	if err != nil {
		b.Fatal(err)
	}
	floor := func() {
		if rs, err := q.Eval(ctx, rego.EvalParsedInput(floorIn)); err != nil || len(rs) != 1 {
			b.Fatal(rs, err)
		}
	}
	stats := func(durs []time.Duration) (mean, p99 float64) {
		var sum time.Duration
		for _, d := range durs {
			sum += d
		}
		slices.Sort(durs)
		return float64(sum) / float64(len(durs)), float64(durs[len(durs)*99/100])
	}
	// measure times f and, unless alone, the floor right after each call of
	// f; ns/op is then f's alone (its durations' mean).
	measure := func(b *testing.B, alone bool, f func(i int)) {
		f(-1)
		floor()
		var allocs, bytes float64
		if !alone {
			var m0, m1 runtime.MemStats
			const n = 2000
			runtime.ReadMemStats(&m0)
			for i := range n {
				f(i)
			}
			runtime.ReadMemStats(&m1)
			allocs, bytes = float64(m1.Mallocs-m0.Mallocs)/n, float64(m1.TotalAlloc-m0.TotalAlloc)/n
		}
		b.ReportAllocs()
		durs := make([]time.Duration, 0, b.N)
		fdurs := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		i := 0
		for b.Loop() {
			t0 := time.Now()
			f(i)
			t1 := time.Now()
			durs = append(durs, t1.Sub(t0))
			if !alone {
				floor()
				fdurs = append(fdurs, time.Since(t1))
			}
			i++
		}
		b.StopTimer()
		mean, p99 := stats(durs)
		b.ReportMetric(p99, "p99-ns")
		if !alone {
			fmean, fp99 := stats(fdurs)
			b.ReportMetric(mean, "ns/op")
			b.ReportMetric(fmean, "floor-ns")
			b.ReportMetric(fp99, "floor-p99-ns")
			b.ReportMetric(mean/fmean, "x-floor")
			b.ReportMetric(p99/fp99, "p99-x-floor")
			b.ReportMetric(allocs, "decision-allocs/op")
			b.ReportMetric(bytes, "decision-B/op")
		}
	}
	b.Run("floor", func(b *testing.B) { measure(b, true, func(int) { floor() }) })

	e, _, _ := newEngine(b, nil)
	nss := benchNamespaces(8, "ro")
	const callers = 256
	ins := make([]*authz.Input, callers)
	for i := range ins {
		id := fmt.Sprintf("spiffe://example.org/node/n%d", i)
		in := connectInput(nss)
		in = call(id, in.RPC.FullMethod, deepCopy(in.Resource).(map[string]any))
		in.Resource["job"].(map[string]any)["nodes"] = []any{id} // the gateway narrows nodes to the caller
		in.Resource["host_binding"] = bindingRec(id, fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-5000-8000-000000000000", i), "acme", true)
		in.Resource["request"] = map[string]any{"host_nqn": "", "ttl": "2h", "mode": ""}
		ins[i] = in
	}
	// The same with the resource typed (Input.Scope, no Resource), as the
	// gateway describes it: no record is walked as a map.
	typed := make([]*authz.Input, callers)
	for i, in := range ins {
		s, err := authz.ScopeFromResource(in.Resource)
		if err != nil {
			b.Fatal(err)
		}
		cp := *in
		cp.Resource, cp.Scope = nil, s
		typed[i] = &cp
	}
	// Sealed, as the gateway hands scopes over: the job's scope part
	// sealed once (Scope.Sealed), each caller a copy with its own caller
	// fields.
	template := typed[0].Scope.Sealed()
	sealed := make([]*authz.Input, callers)
	for i, in := range typed {
		s := *template
		s.Binding, s.Job.Nodes, s.Request = in.Scope.Binding, in.Scope.Job.Nodes, in.Scope.Request
		cp := *in
		cp.Scope = &s
		sealed[i] = &cp
	}
	decide := func(b *testing.B, in *authz.Input) {
		if d, err := e.Authorize(ctx, in); err != nil || !d.Allow {
			b.Fatal(d, err)
		}
	}
	for name, set := range map[string][]*authz.Input{"warm": ins, "warm-typed": typed, "warm-sealed": sealed} {
		b.Run(name, func(b *testing.B) {
			for _, in := range set {
				decide(b, in)
			}
			measure(b, false, func(i int) { decide(b, set[(i+callers)%callers]) })
		})
	}
	// A storm: every call a node not seen before in a job already decided
	// (the scope memo warm, the caller's part decided anew).
	b.Run("new-caller", func(b *testing.B) {
		measure(b, false, func(i int) {
			in := *typed[0]
			s := *in.Scope
			id := fmt.Sprintf("spiffe://example.org/node/storm-%d", stormNode.Add(1))
			in.Caller.ID = id
			s.Job.Nodes = []string{id}
			s.Binding = authz.ScopeBinding{SPIFFEID: id, HostNQN: fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:%08x-0000-5000-8000-%012x", i, b.N), Tenant: "acme", Bound: true}
			in.Scope = &s
			decide(b, &in)
		})
	})
	b.Run("cold", func(b *testing.B) {
		measure(b, false, func(i int) {
			in := *ins[0]
			in.Resource = maps.Clone(in.Resource)
			job := maps.Clone(in.Resource["job"].(map[string]any))
			job["job_id"] = fmt.Sprintf("cold-%d-%d", b.N, i)
			in.Resource["job"] = job
			decide(b, &in)
		})
	})
}
