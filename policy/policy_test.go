package policy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
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
	if got, want := fmt.Sprint(names(b.Modules)), "[admit.rego authz.rego classes.rego compliance.rego connect.rego data.rego input.rego residency.rego scope.rego]"; got != want {
		t.Errorf("modules = %s, want %s", got, want)
	}
	if len(b.Tests) < 5 {
		t.Errorf("tests = %v", names(b.Tests))
	}
	if len(b.Samples) < 2 {
		t.Errorf("%d samples", len(b.Samples))
	}
	if !revisionRE.MatchString(b.Revision) || b.Revision != b.Digest {
		t.Errorf("revision %q, digest %q", b.Revision, b.Digest)
	}
	if fmt.Sprint(b.DataFiles) != "[data.json]" {
		t.Errorf("data files %v", b.DataFiles)
	}
	nv, ok := b.Data["nvmegate"].(map[string]any)
	if !ok || nv["roles"] == nil || nv["classes"] == nil || nv["residency"] == nil {
		t.Errorf("data.nvmegate = %v", b.Data["nvmegate"])
	}

	// The embedded bundle is exactly what is in the directory: a .rego file
	// added without being embedded would change the revision.
	dir, err := policy.LoadDir(".")
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
		"data.json":            `{"top": {"x": 1}, "n": 1.50}`,
		"sites/eu/data.json":   `{"fence": ["eu-west"]}`,
		"top/y/data.json":      `{"z": true}`,
		"other.json":           `{"ignored": true}`,
		".a.rego.swp":          "ignored",
		"..data/a.rego":        "package hidden",
		"..data/data.json":     `{"hidden": true}`,
		"lib/selftest.json":    "not at the root: ignored",
		"lib/.manifest":        "not at the root: ignored",
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
	if got, want := fmt.Sprint(b.DataFiles), "[data.json sites/eu/data.json top/y/data.json]"; got != want {
		t.Errorf("data files = %s, want %s", got, want)
	}
	got, _ := json.Marshal(b.Data)
	if want := `{"n":1.50,"sites":{"eu":{"fence":["eu-west"]}},"top":{"x":1,"y":{"z":true}}}`; string(got) != want {
		t.Errorf("data = %s, want %s", got, want)
	}
}

func TestLoadManifest(t *testing.T) {
	files := map[string]string{"a.rego": "package a", "selftest.json": minimalSamples}
	plain, err := policy.Load(mapFS(files))
	if err != nil {
		t.Fatal(err)
	}
	files[".manifest"] = `{"revision": "v42", "roots": [""], "rego_version": 1, "metadata": {"x": 1}}`
	b, err := policy.Load(mapFS(files))
	if err != nil {
		t.Fatal(err)
	}
	if b.Revision != "v42" || !revisionRE.MatchString(b.Digest) || b.Digest == plain.Digest {
		t.Errorf("revision %q digest %q (without manifest %q)", b.Revision, b.Digest, plain.Digest)
	}
	files[".manifest"] = `{"revision": ""}`
	if b, err := policy.Load(mapFS(files)); err != nil || b.Revision != b.Digest {
		t.Errorf("empty revision: %+v, %v", b, err)
	}
}

func TestLoadSamplesFromData(t *testing.T) {
	// What `opa build` (without -b) makes of selftest.json: data.samples.
	b, err := policy.Load(mapFS(map[string]string{
		"a.rego":    "package a",
		"data.json": `{"x": 1, "samples": ` + strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(minimalSamples), `{"samples": `), "}") + `}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Samples) != 2 || b.Samples[1].Reasons[0] != "r" {
		t.Errorf("samples %+v", b.Samples)
	}
}

func TestBundleFS(t *testing.T) {
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	again, err := policy.Load(b.FS())
	if err != nil {
		t.Fatal(err)
	}
	if again.Revision != b.Revision || !reflect.DeepEqual(again.Data, b.Data) || len(again.Samples) != len(b.Samples) {
		t.Error("Load(b.FS()) differs from b")
	}
}

func TestLoadDirErrors(t *testing.T) {
	if _, err := policy.LoadDir(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.rego"), []byte("package a"), 0o644)
	if _, err := policy.LoadDir(dir); !errors.Is(err, policy.ErrNoSelfTest) || !strings.Contains(err.Error(), dir) {
		t.Errorf("no selftest: %v", err)
	}
}

// tarGz writes a gzip-compressed tar archive of files (in order) to a temp
// file and returns its path.
func tarGz(t *testing.T, files [][2]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range files {
		name, data := f[0], f[1]
		if strings.HasSuffix(name, "/") {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755})
			continue
		}
		if strings.HasPrefix(data, "->") {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: data[2:]})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
		tw.Write([]byte(data))
	}
	tw.Close()
	zw.Close()
	p := filepath.Join(t.TempDir(), "bundle.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadBundleFile(t *testing.T) {
	// The default policy as a bundle file, with the leading slashes and the
	// .manifest that opa build writes.
	var files [][2]string
	files = append(files, [2]string{"/", ""}, [2]string{"/.manifest", `{"revision": "2026.10.1", "roots": [""]}`})
	entries, _ := fs.ReadDir(policy.Default(), ".")
	for _, e := range entries {
		data, _ := fs.ReadFile(policy.Default(), e.Name())
		files = append(files, [2]string{"/" + e.Name(), string(data)})
	}
	files = append(files, [2]string{"/link.rego", "->authz.rego"})
	b, err := policy.LoadBundleFile(tarGz(t, files))
	if err != nil {
		t.Fatal(err)
	}
	def, _ := policy.Load(policy.Default())
	if b.Revision != "2026.10.1" || len(b.Modules) != len(def.Modules) || !reflect.DeepEqual(b.Data, def.Data) || len(b.Samples) != len(def.Samples) {
		t.Errorf("bundle file: revision %s, %d modules", b.Revision, len(b.Modules))
	}

	for name, tc := range map[string]struct {
		files [][2]string
		want  error
	}{
		"parent path":     {[][2]string{{"../a.rego", "package a"}}, policy.ErrBundleFile},
		"dot path":        {[][2]string{{"./a.rego", "package a"}}, policy.ErrBundleFile},
		"repeated":        {[][2]string{{"a.rego", "package a"}, {"/a.rego", "package a"}}, policy.ErrBundleFile},
		"no modules":      {[][2]string{{"selftest.json", minimalSamples}}, policy.ErrNoModules},
		"bad data":        {[][2]string{{"a.rego", ""}, {"selftest.json", minimalSamples}, {"data.json", "[]"}}, policy.ErrData},
		"bad manifest":    {[][2]string{{"a.rego", ""}, {"selftest.json", minimalSamples}, {".manifest", "[]"}}, policy.ErrManifest},
		"no selftest":     {[][2]string{{"a.rego", ""}}, policy.ErrNoSelfTest},
		"rego v0":         {[][2]string{{"a.rego", ""}, {"selftest.json", minimalSamples}, {".manifest", `{"rego_version": 0}`}}, policy.ErrManifest},
		"manifest fields": {[][2]string{{"a.rego", ""}, {"selftest.json", minimalSamples}, {".manifest", `{"revision": 7}`}}, policy.ErrManifest},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := policy.LoadBundleFile(tarGz(t, tc.files)); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
		})
	}

	notGzip := filepath.Join(t.TempDir(), "x.tar.gz")
	os.WriteFile(notGzip, []byte("not gzip"), 0o644)
	if _, err := policy.LoadBundleFile(notGzip); !errors.Is(err, policy.ErrBundleFile) {
		t.Errorf("not gzip: %v", err)
	}
	if _, err := policy.LoadBundleFile(filepath.Join(t.TempDir(), "missing.tar.gz")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
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
		"data":           with("data.json", `{"x": 1}`),
		"nested data":    with("x/data.json", `{}`),
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
		"data not json":       {map[string]string{"a.rego": "", "selftest.json": minimalSamples, "data.json": "{"}, policy.ErrData},
		"data not object":     {map[string]string{"a.rego": "", "selftest.json": minimalSamples, "data.json": `[1]`}, policy.ErrData},
		"data trailing":       {map[string]string{"a.rego": "", "selftest.json": minimalSamples, "data.json": `{} {}`}, policy.ErrData},
		"data conflict":       {map[string]string{"a.rego": "", "selftest.json": minimalSamples, "data.json": `{"a": {"b": 1}}`, "a/data.json": `{"b": 2}`}, policy.ErrData},
		"data path conflict":  {map[string]string{"a.rego": "", "selftest.json": minimalSamples, "data.json": `{"a": 1}`, "a/data.json": `{"b": 2}`}, policy.ErrData},
		"manifest not json":   {map[string]string{"a.rego": "", "selftest.json": minimalSamples, ".manifest": "{"}, policy.ErrManifest},
		"samples in bad data": {map[string]string{"a.rego": "", "data.json": `{"samples": 1}`}, policy.ErrNoSelfTest},
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
	fmt.Println("data:", b.DataFiles)
	fmt.Println(revisionRE.MatchString(b.Revision))
	// Output:
	// module: admit.rego
	// module: authz.rego
	// module: classes.rego
	// module: compliance.rego
	// module: connect.rego
	// module: data.rego
	// module: input.rego
	// module: residency.rego
	// module: scope.rego
	// data: [data.json]
	// true
}
