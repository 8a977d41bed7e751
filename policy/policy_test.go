package policy_test

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"testing"
	"testing/fstest"

	"github.com/nvmegate/nvmegate/policy"
)

const minimalSamples = `{"samples": [
 {"name": "a", "input": {}, "allow": true},
 {"name": "d", "input": {"x": 1}, "allow": false, "reasons": ["r"]}
]}`

func mapFS(files map[string]string) fstest.MapFS {
	m := fstest.MapFS{}
	for k, v := range files {
		m[k] = &fstest.MapFile{Data: []byte(v)}
	}
	return m
}

var revisionRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestLoadDefault(t *testing.T) {
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Modules) != 1 || b.Modules[0].Name != "authz.rego" {
		t.Errorf("modules = %v, want [authz.rego]", names(b.Modules))
	}
	if len(b.Tests) != 1 || b.Tests[0].Name != "authz_test.rego" {
		t.Errorf("tests = %v, want [authz_test.rego]", names(b.Tests))
	}
	if len(b.Samples) < 2 {
		t.Errorf("%d samples", len(b.Samples))
	}
	if !revisionRE.MatchString(b.Revision) {
		t.Errorf("revision %q", b.Revision)
	}

	// The embedded bundle is exactly what is in the directory: a .rego file
	// added without being embedded would change the revision.
	dir, err := policy.Load(os.DirFS("."))
	if err != nil {
		t.Fatal(err)
	}
	if dir.Revision != b.Revision {
		t.Errorf("directory revision %s != embedded revision %s", dir.Revision, b.Revision)
	}
}

func TestLoadSplitsTestsAndWalksSubdirectories(t *testing.T) {
	b, err := policy.Load(mapFS(map[string]string{
		"b.rego":               "package b",
		"a.rego":               "package a",
		"lib/util.rego":        "package lib",
		"lib/util_test.rego":   "package lib_test",
		"a_test.rego":          "package a_test",
		"selftest.json":        minimalSamples,
		"README.md":            "ignored",
		"data.json":            `{"ignored": true}`,
		".a.rego.swp":          "ignored",
		"..data/a.rego":        "package hidden",
		"lib/selftest.json":    "not at the root: ignored",
		"notrego.rego.orig":    "ignored",
		"policy.go":            "package policy",
		"testdata/more.rego":   "package more",
		"testdata/.hid/x.rego": "package x",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(names(b.Modules)), "[a.rego b.rego lib/util.rego testdata/more.rego]"; got != want {
		t.Errorf("modules = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(names(b.Tests)), "[a_test.rego lib/util_test.rego]"; got != want {
		t.Errorf("tests = %s, want %s", got, want)
	}
	if len(b.Samples) != 2 || b.Samples[0].Name != "a" || !*b.Samples[0].Allow || *b.Samples[1].Allow || b.Samples[1].Reasons[0] != "r" {
		t.Errorf("samples = %+v", b.Samples)
	}
}

func TestRevision(t *testing.T) {
	base := map[string]string{"a.rego": "package a", "selftest.json": minimalSamples}
	rev := func(files map[string]string) string {
		t.Helper()
		b, err := policy.Load(mapFS(files))
		if err != nil {
			t.Fatal(err)
		}
		return b.Revision
	}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		m[k] = v
		return m
	}
	r0 := rev(base)
	if rev(base) != r0 {
		t.Fatal("revision is not deterministic")
	}
	for name, files := range map[string]map[string]string{
		"module content": with("a.rego", "package a "),
		"extra module":   with("b.rego", ""),
		"test module":    with("a_test.rego", "package a_test"),
		"samples":        with("selftest.json", minimalSamples+" "),
		"renamed module": {"b.rego": "package a", "selftest.json": minimalSamples},
	} {
		if r := rev(files); r == r0 {
			t.Errorf("%s: revision unchanged", name)
		}
	}
	// Moving bytes across file boundaries must not collide.
	if rev(map[string]string{"a.rego": "x", "b.rego": "", "selftest.json": minimalSamples}) ==
		rev(map[string]string{"a.rego": "xb.rego\x00", "selftest.json": minimalSamples}) {
		t.Error("file boundaries are ambiguous")
	}
	// Ignored files do not change it.
	if rev(with("README.md", "x")) != r0 {
		t.Error("an ignored file changed the revision")
	}
}

func TestLoadErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		files map[string]string
		want  error
	}{
		"no modules":           {map[string]string{"a_test.rego": "package a_test", "selftest.json": minimalSamples}, policy.ErrNoModules},
		"empty":                {map[string]string{}, policy.ErrNoModules},
		"no selftest":          {map[string]string{"a.rego": "package a"}, policy.ErrNoSelfTest},
		"selftest not json":    {map[string]string{"a.rego": "", "selftest.json": "{"}, policy.ErrNoSelfTest},
		"selftest trailing":    {map[string]string{"a.rego": "", "selftest.json": minimalSamples + "{}"}, policy.ErrNoSelfTest},
		"unknown field":        {map[string]string{"a.rego": "", "selftest.json": `{"samples": [], "x": 1}`}, policy.ErrNoSelfTest},
		"unknown sample field": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [{"name": "a", "input": {}, "allow": true, "alow": false}]}`}, policy.ErrNoSelfTest},
		"no samples":           {map[string]string{"a.rego": "", "selftest.json": `{"samples": []}`}, policy.ErrNoSelfTest},
		"only allows": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}]}`}, policy.ErrNoSelfTest},
		"only denies": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": false}]}`}, policy.ErrNoSelfTest},
		"missing allow": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}, {"name": "b", "input": {}}]}`}, policy.ErrNoSelfTest},
		"missing name": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}, {"input": {}, "allow": false}]}`}, policy.ErrNoSelfTest},
		"duplicate name": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}, {"name": "a", "input": {}, "allow": false}]}`}, policy.ErrNoSelfTest},
		"input not object": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}, {"name": "b", "input": [], "allow": false}]}`}, policy.ErrNoSelfTest},
		"input missing": {map[string]string{"a.rego": "", "selftest.json": `{"samples": [
			{"name": "a", "input": {}, "allow": true}, {"name": "b", "allow": false}]}`}, policy.ErrNoSelfTest},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := policy.Load(mapFS(tc.files))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Load = %v, %v; want %v", b, err, tc.want)
			}
		})
	}
}

// FuzzLoadSelfTest feeds arbitrary selftest.json contents to Load: it must
// not panic, and a bundle it accepts must hold what the engine relies on.
func FuzzLoadSelfTest(f *testing.F) {
	f.Add(minimalSamples)
	f.Add(`{"samples": null}`)
	f.Add(`{"samples": [{"name": "", "input": null, "allow": null}]}`)
	f.Fuzz(func(t *testing.T, selftest string) {
		b, err := policy.Load(mapFS(map[string]string{"a.rego": "package a", "selftest.json": selftest}))
		if err != nil {
			if !errors.Is(err, policy.ErrNoSelfTest) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		var allow, deny bool
		seen := map[string]bool{}
		for _, s := range b.Samples {
			if s.Name == "" || seen[s.Name] || s.Allow == nil || len(s.Input) == 0 {
				t.Fatalf("accepted bad sample %+v", s)
			}
			seen[s.Name] = true
			allow = allow || *s.Allow
			deny = deny || !*s.Allow
		}
		if !allow || !deny {
			t.Fatal("accepted samples without both outcomes")
		}
	})
}

func names(ms []policy.Module) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func ExampleLoad() {
	// A site's policy directory would be os.DirFS("/etc/nvmegate/policy").
	b, err := policy.Load(policy.Default())
	if err != nil {
		panic(err)
	}
	for _, m := range b.Modules {
		fmt.Println("module:", m.Name)
	}
	for _, m := range b.Tests {
		fmt.Println("test:", m.Name)
	}
	fmt.Println(revisionRE.MatchString(b.Revision))
	// Output:
	// module: authz.rego
	// test: authz_test.rego
	// true
}
