package policy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/policy"
)

// The shipped Rego's segmentation (segment_ok) and the gateway's
// (nvmegate.HostBinding.Reaches, which lists the ports of Discover and of
// a connect's answer) are one rule: over random segments and ports, a
// connect passes segment_ok exactly when some port is reachable by
// Reaches. Subnets are drawn from a few overlapping prefixes so that
// inside, outside, equal, wider and narrower all occur.
func TestSegmentationAgreesWithReaches(t *testing.T) {
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	opts := []func(*rego.Rego){rego.Query("data.nvmegate.authz.segment_ok"), rego.SetRegoVersion(ast.RegoV1), rego.StrictBuiltinErrors(true)}
	for _, m := range b.Modules {
		opts = append(opts, rego.Module(m.Name, m.Source))
	}
	q, err := rego.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pool := []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.3.0/24", "10.2.0.0/16", "10.1.2.128/25", "192.168.0.0/16", "fd00::/8", "fd00:1::/32"}
	r := rand.New(rand.NewPCG(23, 29))
	agreed, allowed := 0, 0
	for range 2000 {
		var subnets []string
		for range r.IntN(3) {
			subnets = append(subnets, pool[r.IntN(len(pool))])
		}
		h := nvmegate.HostBinding{Subnets: subnets}
		var ports []any
		reach := false
		for i := range 1 + r.IntN(3) {
			p := nvmegate.Port{ID: uint16(i + 1)}
			if r.IntN(4) > 0 {
				p.Subnet = pool[r.IntN(len(pool))]
			}
			ports = append(ports, map[string]any{"id": i + 1, "subnet": p.Subnet})
			reach = reach || h.Reaches(p)
		}
		sn := []any{}
		for _, s := range subnets {
			sn = append(sn, s)
		}
		in := map[string]any{"action": "access.connect", "resource": map[string]any{"host_binding": map[string]any{"subnets": sn}, "ports": ports}}
		rs, err := q.Eval(context.Background(), rego.EvalInput(in))
		if err != nil {
			t.Fatal(err)
		}
		rego := len(rs) > 0 && rs[0].Expressions[0].Value == true
		if rego != reach {
			t.Fatalf("segment %v, ports %v: Rego %t, Reaches %t", subnets, ports, rego, reach)
		}
		agreed++
		if reach {
			allowed++
		}
	}
	if allowed == 0 || allowed == agreed {
		t.Fatalf("%d of %d cases reachable: the draw does not cover both outcomes", allowed, agreed)
	}
	t.Log(fmt.Sprintf("%d cases agree, %d reachable", agreed, allowed))
}
