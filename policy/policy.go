package policy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"testing/fstest"
)

// Names of the special files of a bundle directory.
const (
	// SelfTestFile holds the self-test samples; at the root only.
	SelfTestFile = "selftest.json"
	// DataFile holds data: a JSON object that is loaded at the data path of
	// its directory ("data.json" at data, "sites/eu/data.json" at
	// data.sites.eu), as in OPA bundles and `opa test`.
	DataFile = "data.json"
	// ManifestFile is the optional OPA bundle manifest; at the root only.
	ManifestFile = ".manifest"
)

// MaxBundleFileSize bounds what LoadBundleFile reads: the uncompressed size
// of all files together (a gzip bomb stops here).
const MaxBundleFileSize = 256 << 20

//go:embed *.rego selftest.json data.json
var defaultFS embed.FS

// Default returns the embedded default policy: the .rego files, data.json
// and selftest.json of this package's directory.
func Default() fs.FS { return defaultFS }

// Errors returned by Load, LoadDir and LoadBundleFile. Each is wrapped with
// the offending file or sample; the caller must fix the bundle.
var (
	// ErrNoModules: the directory holds no policy module (non-test .rego).
	ErrNoModules = errors.New("policy: no policy modules")
	// ErrNoSelfTest: selftest.json is missing, malformed, or does not hold
	// at least one allowing and one denying sample.
	ErrNoSelfTest = errors.New("policy: no usable self-test samples")
	// ErrData: a data.json is not a JSON object, or two data files define
	// the same key.
	ErrData = errors.New("policy: invalid data")
	// ErrManifest: .manifest is not a JSON object of the OPA bundle
	// manifest's shape, or names a Rego version other than 1.
	ErrManifest = errors.New("policy: invalid manifest")
	// ErrBundleFile: a bundle file is not a gzip-compressed tar archive, is
	// larger than MaxBundleFileSize, or holds an unsafe or repeated path.
	ErrBundleFile = errors.New("policy: invalid bundle file")
)

// Module is one Rego source file of a bundle.
type Module struct {
	Name   string // slash-separated path within the bundle, e.g. "authz.rego"
	Source string // the file's contents
}

// Sample is one self-test case: the engine evaluates Input and compares the
// outcome.
type Sample struct {
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`             // one input document (a JSON object)
	Allow   *bool           `json:"allow"`             // expected outcome; required
	Reasons []string        `json:"reasons,omitempty"` // if set, the exact expected reasons
}

// Bundle is a loaded policy: what the engine compiles and serves, what
// tests it, and the samples it must decide correctly before serving.
// Bundles are values; nothing modifies one after Load, and callers must not
// either (Data is shared with the engine that serves it).
type Bundle struct {
	Modules   []Module       // policy modules, sorted by name; compiled by the engine
	Tests     []Module       // *_test.rego modules, sorted by name; for opa test / go test only
	Samples   []Sample       // from selftest.json, in file order
	Data      map[string]any // the data document: every data.json merged; never nil
	DataFiles []string       // the data.json files, sorted
	// Revision names the bundle in decisions, logs and audit entries: the
	// .manifest's revision if it sets one, else Digest.
	Revision string
	// Digest is "sha256:<hex>" over every loaded file (see package doc); it
	// changes with any change to a loaded file, whatever the manifest says.
	Digest string

	files map[string][]byte // every loaded file, for FS
}

// FS returns the loaded files as a read-only file system: Load(b.FS())
// yields an equal bundle. To build a candidate from a serving bundle (other
// modules, more data), use With.
func (b *Bundle) FS() fs.FS {
	m := fstest.MapFS{}
	for name, data := range b.files {
		m[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	return m
}

// Files returns a copy of the loaded files (path → contents): what the
// digest covers, and what LoadFiles loads again.
func (b *Bundle) Files() map[string][]byte {
	out := make(map[string][]byte, len(b.files))
	for name, data := range b.files {
		out[name] = bytes.Clone(data)
	}
	return out
}

// LoadFiles loads a bundle from its files (Files), as Load does.
func LoadFiles(files map[string][]byte) (*Bundle, error) {
	m := fstest.MapFS{}
	for name, data := range files {
		m[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	return Load(m)
}

// With loads a new bundle: b's files with files added or replaced (path →
// contents). It builds candidates (Policy.Explain) and merges extra data
// (`nvmegate policy eval --data`) without touching b.
func (b *Bundle) With(files map[string][]byte) (*Bundle, error) {
	m := fstest.MapFS{}
	for name, data := range b.files {
		m[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	for name, data := range files {
		m[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	return Load(m)
}

// LoadDir loads the bundle directory dir (see Load).
func LoadDir(dir string) (*Bundle, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("policy: load %s: %w", dir, err)
	}
	b, err := Load(os.DirFS(dir))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return b, nil
}

// LoadBundleFile loads an OPA bundle file: a gzip-compressed tar archive of
// a bundle directory, as `tar czf` or `opa build` write it. Its files are
// read as Load reads a directory (leading slashes dropped; directories,
// links and other non-regular entries ignored). Bundle signatures
// (.signatures.json) are not verified: trust in the file comes from where
// it was read from.
//
// `opa build` (without -b) turns selftest.json into the data document
// "samples" rather than keeping the file; Load takes the samples from there
// when the archive has no selftest.json.
func LoadBundleFile(file string) (*Bundle, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("policy: load %s: %w", file, err)
	}
	defer f.Close()
	fsys, err := readTarGz(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBundleFile, file, err)
	}
	b, err := Load(fsys)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return b, nil
}

func readTarGz(r io.Reader) (fstest.MapFS, error) {
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	fsys := fstest.MapFS{}
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fsys, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimLeft(h.Name, "/")
		if name == "" || !fs.ValidPath(name) || path.Clean(name) != name {
			return nil, fmt.Errorf("unsafe path %q", h.Name)
		}
		if _, dup := fsys[name]; dup {
			return nil, fmt.Errorf("%s appears twice", name)
		}
		if h.Size < 0 || total+h.Size > MaxBundleFileSize {
			return nil, fmt.Errorf("larger than %d bytes", MaxBundleFileSize)
		}
		data, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil {
			return nil, err
		}
		total += int64(len(data))
		fsys[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
}

// Load reads a bundle from fsys: every *.rego file (walking subdirectories,
// skipping hidden names; *_test.rego into Tests), every data.json (at the
// data path of its directory), and at the root selftest.json and an
// optional .manifest. Symbolic links to files are followed (ConfigMap mounts
// use them). It checks the shape of the bundle, not the Rego: compiling is
// the engine's job, and a bundle that does not compile or fails its samples
// is refused there.
func Load(fsys fs.FS) (*Bundle, error) {
	type file struct {
		name string
		data []byte
	}
	var files []file
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != "." && p != ManifestFile && strings.HasPrefix(d.Name(), ".") {
			// Hidden: editor files, and the ..data / ..<timestamp>
			// directories of a Kubernetes ConfigMap mount, whose files
			// the visible symlinks already name.
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !(strings.HasSuffix(p, ".rego") || path.Base(p) == DataFile || p == SelfTestFile || p == ManifestFile) {
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files = append(files, file{p, data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("policy: load: %w", err)
	}
	// WalkDir visits in lexical order already; sort anyway so the digest
	// never depends on an fs.FS implementation's order.
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })

	b := &Bundle{Data: map[string]any{}, files: make(map[string][]byte, len(files))}
	h := sha256.New()
	var selftest, manifest []byte
	for _, f := range files {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f.data)))
		h.Write([]byte(f.name))
		h.Write([]byte{0})
		h.Write(n[:])
		h.Write(f.data)
		b.files[f.name] = f.data

		switch {
		case f.name == SelfTestFile:
			selftest = f.data
		case f.name == ManifestFile:
			manifest = f.data
		case path.Base(f.name) == DataFile:
			if err := mergeDataFile(b.Data, f.name, f.data); err != nil {
				return nil, err
			}
			b.DataFiles = append(b.DataFiles, f.name)
		case strings.HasSuffix(path.Base(f.name), "_test.rego"):
			b.Tests = append(b.Tests, Module{f.name, string(f.data)})
		default:
			b.Modules = append(b.Modules, Module{f.name, string(f.data)})
		}
	}
	b.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	b.Revision = b.Digest
	if manifest != nil {
		rev, err := parseManifest(manifest)
		if err != nil {
			return nil, err
		}
		if rev != "" {
			b.Revision = rev
		}
	}

	if len(b.Modules) == 0 {
		return nil, ErrNoModules
	}
	if selftest == nil {
		samples, ok := b.Data["samples"]
		if !ok {
			return nil, fmt.Errorf("%w: %s is missing", ErrNoSelfTest, SelfTestFile)
		}
		// What `opa build` makes of selftest.json: the same document as data.
		if selftest, err = json.Marshal(map[string]any{"samples": samples}); err != nil {
			return nil, fmt.Errorf("%w: data.samples: %v", ErrNoSelfTest, err)
		}
	}
	if b.Samples, err = parseSamples(selftest); err != nil {
		return nil, err
	}
	return b, nil
}

// mergeDataFile decodes the data file name and merges it into root at the
// data path of its directory.
func mergeDataFile(root map[string]any, name string, data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrData, name, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: %s: trailing data", ErrData, name)
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("%w: %s is not a JSON object", ErrData, name)
	}
	node := root
	if dir := path.Dir(name); dir != "." {
		for _, seg := range strings.Split(dir, "/") {
			next, exists := node[seg]
			if !exists {
				m := map[string]any{}
				node[seg], next = m, m
			}
			m, ok := next.(map[string]any)
			if !ok {
				return fmt.Errorf("%w: %s: data.%s is already defined", ErrData, name, strings.ReplaceAll(dir, "/", "."))
			}
			node = m
		}
	}
	if k := mergeObjects(node, obj); k != "" {
		return fmt.Errorf("%w: %s: key %q is defined by another data file", ErrData, name, k)
	}
	return nil
}

// mergeObjects merges src into dst, objects recursively. It returns the
// first key both define as something else than two objects, or "".
func mergeObjects(dst, src map[string]any) string {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := src[k]
		old, exists := dst[k]
		if !exists {
			dst[k] = v
			continue
		}
		a, ok1 := old.(map[string]any)
		b, ok2 := v.(map[string]any)
		if !ok1 || !ok2 {
			return k
		}
		if c := mergeObjects(a, b); c != "" {
			return k + "." + c
		}
	}
	return ""
}

// parseManifest reads .manifest and returns its revision.
func parseManifest(data []byte) (string, error) {
	var m struct {
		Revision    *string `json:"revision"`
		RegoVersion *int    `json:"rego_version"`
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		return "", fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if _, ok := raw.(map[string]any); !ok {
		return "", fmt.Errorf("%w: not a JSON object", ErrManifest)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return "", fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if m.RegoVersion != nil && *m.RegoVersion != 1 {
		return "", fmt.Errorf("%w: rego_version %d: only Rego v1 is supported", ErrManifest, *m.RegoVersion)
	}
	if m.Revision == nil {
		return "", nil
	}
	return *m.Revision, nil
}

// parseSamples decodes and checks selftest.json.
func parseSamples(data []byte) ([]Sample, error) {
	var doc struct {
		Samples []Sample `json:"samples"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNoSelfTest, SelfTestFile, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: trailing data", ErrNoSelfTest, SelfTestFile)
	}
	seen := map[string]bool{}
	var allows, denies int
	for i, s := range doc.Samples {
		switch {
		case s.Name == "":
			return nil, fmt.Errorf("%w: %s: sample %d has no name", ErrNoSelfTest, SelfTestFile, i)
		case seen[s.Name]:
			return nil, fmt.Errorf("%w: %s: sample %q appears twice", ErrNoSelfTest, SelfTestFile, s.Name)
		case !isObject(s.Input):
			return nil, fmt.Errorf("%w: %s: sample %q: input must be an object", ErrNoSelfTest, SelfTestFile, s.Name)
		case s.Allow == nil:
			return nil, fmt.Errorf("%w: %s: sample %q: allow is required", ErrNoSelfTest, SelfTestFile, s.Name)
		}
		seen[s.Name] = true
		if *s.Allow {
			allows++
		} else {
			denies++
		}
	}
	if allows == 0 || denies == 0 {
		return nil, fmt.Errorf("%w: %s needs at least one allowing and one denying sample (has %d and %d)",
			ErrNoSelfTest, SelfTestFile, allows, denies)
	}
	return doc.Samples, nil
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}
