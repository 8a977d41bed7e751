package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/nvmegate/nvmegate/policy"
)

// TestRego runs the embedded *_test.rego files through OPA's tester with
// the bundle's data, as `opa test policy/` does, and fails on any failing
// or erroring Rego test. It also requires every line of the policy modules
// to be covered, so a rule added without a test fails here.
func TestRego(t *testing.T) {
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Tests) == 0 {
		t.Fatal("no *_test.rego in the embedded bundle")
	}
	modules := map[string]*ast.Module{}
	for _, m := range append(append([]policy.Module{}, b.Modules...), b.Tests...) {
		mod, err := ast.ParseModuleWithOpts(m.Name, m.Source, ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			t.Fatalf("parse %s: %v", m.Name, err)
		}
		modules[m.Name] = mod
	}

	// The data document opa test sees: every data.json, and selftest.json
	// (a JSON file, so loaded at the root: data.samples).
	data := map[string]any{}
	for k, v := range b.Data {
		data[k] = v
	}
	data["samples"] = b.Samples

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cov := cover.New()
	compiler := ast.NewCompiler().
		WithCapabilities(ast.CapabilitiesForThisVersion()).
		WithDefaultRegoVersion(ast.RegoV1).
		WithStrict(true)
	ch, err := tester.NewRunner().
		SetCompiler(compiler).
		SetDefaultRegoVersion(ast.RegoV1).
		RaiseBuiltinErrors(true).
		SetCoverageQueryTracer(cov).
		SetModules(modules).
		SetStore(inmem.NewFromObject(roundTrip(t, data))).
		RunTests(ctx, nil)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	var n int
	for r := range ch {
		n++
		switch {
		case r.Error != nil:
			t.Errorf("%s.%s: error: %v", r.Package, r.Name, r.Error)
		case r.Fail:
			t.Errorf("%s.%s: FAIL (at %v)", r.Package, r.Name, r.FailedAt)
		case r.Skip:
			t.Logf("%s.%s: skipped", r.Package, r.Name)
		}
	}
	if n == 0 {
		t.Fatal("no Rego tests ran")
	}
	t.Logf("%d Rego tests", n)

	policyModules := map[string]*ast.Module{}
	for _, m := range b.Modules {
		policyModules[m.Name] = modules[m.Name]
	}
	report := cov.Report(policyModules)
	sources := map[string][]string{}
	for _, m := range b.Modules {
		sources[m.Name] = strings.Split(m.Source, "\n")
	}
	for name, fr := range report.Files {
		var lines []string
		for _, r := range fr.NotCovered {
			if r.Start.Row == r.End.Row && uncoverable(sources[name], r.Start.Row) {
				continue
			}
			lines = append(lines, fmt.Sprintf("%d-%d", r.Start.Row, r.End.Row))
		}
		if len(lines) > 0 {
			t.Errorf("%s: lines not covered by Rego tests: %s", name, strings.Join(lines, ", "))
		}
	}
}

// uncoverable reports whether line row of src is one the coverage tracer
// cannot see run: a default rule (used only when data lacks the document,
// which the tests cannot arrange without replacing the policy's own
// package) or the head of a boolean rule whose body is covered.
func uncoverable(src []string, row int) bool {
	if row < 1 || row > len(src) {
		return false
	}
	line := strings.TrimSpace(src[row-1])
	return strings.HasPrefix(line, "default ") || strings.HasSuffix(line, " if {")
}

func roundTrip(t *testing.T, v any) map[string]any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
