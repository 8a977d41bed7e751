package authz_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

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
