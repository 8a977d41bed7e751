package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/policy"
)

// BenchmarkInputConversion compares the ways of handing the input to a
// prepared query; the engine uses the fastest, "parsed-builder".
//
//	parsed-builder  EvalParsedInput(Input.value): AST built by hand
//	input-map       EvalInput(map[string]any): OPA converts the map
//	input-struct    EvalInput(*Input): OPA round-trips the struct through JSON
func BenchmarkInputConversion(b *testing.B) {
	bundle, err := policy.Load(policy.Default())
	if err != nil {
		b.Fatal(err)
	}
	store, err := prepareData(context.Background(), bundle)
	if err != nil {
		b.Fatal(err)
	}
	opts := []func(*rego.Rego){rego.Query(DecisionQuery), rego.SetRegoVersion(ast.RegoV1), rego.GenerateJSON(termResult), rego.Store(store)}
	for _, m := range bundle.Modules {
		opts = append(opts, rego.Module(m.Name, m.Source))
	}
	q, err := rego.New(opts...).PrepareForEval(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	now := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	gw := Gateway{TrustDomain: "example.org"}
	in := NewInput(ParseCaller(spiffeid.RequireFromString("spiffe://example.org/admin/alice")),
		"/nvmegate.v1.Inventory/AddTarget", "", map[string]any{"target": map[string]any{"id": "t1", "region": "eu-west"}})
	in.Gateway, in.Time = gw, now
	var asMap map[string]any
	raw, _ := json.Marshal(in)
	json.Unmarshal(raw, &asMap)

	check := func(b *testing.B, rs rego.ResultSet, err error) {
		out, perr := parseResult(rs)
		if err != nil || perr != nil || !out.allow {
			b.Fatal(out, err, perr)
		}
	}
	ctx := context.Background()
	b.Run("parsed-builder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v, err := in.value(gw, now)
			if err != nil {
				b.Fatal(err)
			}
			rs, err := q.Eval(ctx, rego.EvalParsedInput(v))
			check(b, rs, err)
		}
	})
	b.Run("input-map", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rs, err := q.Eval(ctx, rego.EvalInput(asMap))
			check(b, rs, err)
		}
	})
	b.Run("input-struct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rs, err := q.Eval(ctx, rego.EvalInput(in))
			check(b, rs, err)
		}
	})
}

// TestInputValueMatchesJSON: the hand-built document equals what OPA makes
// of the JSON encoding of Input, so the builder cannot drift from the
// struct tags.
func TestInputValueMatchesJSON(t *testing.T) {
	now := time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	for _, in := range []*Input{
		{},
		NewInput(ParseCaller(spiffeid.RequireFromString("spiffe://example.org/tenant/acme/scheduler/s")),
			"/nvmegate.v1.Jobs/Admit", "jobs.admit", map[string]any{"job": map[string]any{"id": "j", "n": 1.5, "l": []any{"a", true, nil}}}),
	} {
		in.Time = now
		in.Gateway = Gateway{TrustDomain: "example.org"}
		if in.Action == "" {
			in.Action = ActionFromMethod(in.RPC.FullMethod)
		}
		got, err := in.value(in.Gateway, now)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(in)
		want, err := ast.ValueFromReader(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		if in.Resource == nil { // encoding/json says null; the engine says {}
			want.(ast.Object).Insert(ast.StringTerm("resource"), ast.ObjectTerm())
		}
		if got.Compare(want) != 0 {
			t.Errorf("builder:\n %v\njson:\n %v", got, want)
		}
	}
}
