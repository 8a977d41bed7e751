package policy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/tester"

	"github.com/nvmegate/nvmegate/policy"
)

// TestRego runs the embedded *_test.rego files through OPA's tester, as
// `opa test policy/` does, and fails on any failing or erroring Rego test.
// It also requires every line of the policy modules to be covered, so a rule
// added without a test fails here.
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
	for name, fr := range report.Files {
		if fr.NotCoveredLines > 0 {
			var lines []string
			for _, r := range fr.NotCovered {
				lines = append(lines, fmt.Sprintf("%d-%d", r.Start.Row, r.End.Row))
			}
			t.Errorf("%s: %d lines not covered by Rego tests: %s", name, fr.NotCoveredLines, strings.Join(lines, ", "))
		}
	}
}
