package policy

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// SelfTestFile is the name of the self-test samples file at the root of a
// bundle directory.
const SelfTestFile = "selftest.json"

//go:embed *.rego selftest.json
var defaultFS embed.FS

// Default returns the embedded default policy: the .rego files and
// selftest.json of this package's directory.
func Default() fs.FS { return defaultFS }

// Errors returned by Load. Each is wrapped with the offending file or sample;
// the caller must fix the bundle.
var (
	// ErrNoModules: the directory holds no policy module (non-test .rego).
	ErrNoModules = errors.New("policy: no policy modules")
	// ErrNoSelfTest: selftest.json is missing, malformed, or does not hold
	// at least one allowing and one denying sample.
	ErrNoSelfTest = errors.New("policy: no usable self-test samples")
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

// Bundle is a loaded policy: what the engine compiles, what tests it, and
// the samples it must decide correctly before serving. Bundles are values;
// nothing modifies one after Load.
type Bundle struct {
	Modules  []Module // policy modules, sorted by name; compiled by the engine
	Tests    []Module // *_test.rego modules, sorted by name; for opa test / go test only
	Samples  []Sample // from selftest.json, in file order
	Revision string   // "sha256:<hex>" over every loaded file; see package doc
}

// Load reads a bundle from fsys: every *.rego file (walking subdirectories,
// skipping hidden names; *_test.rego into Tests) and selftest.json at the
// root. Symbolic links to files are followed (ConfigMap mounts use them). It checks the
// shape of the bundle, not the Rego: compiling is the engine's job, and a
// bundle that does not compile or fails its samples is refused there.
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
		if p != "." && strings.HasPrefix(d.Name(), ".") {
			// Hidden: editor files, and the ..data / ..<timestamp>
			// directories of a Kubernetes ConfigMap mount, whose files
			// the visible symlinks already name.
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.IsDir() || !(strings.HasSuffix(p, ".rego") || p == SelfTestFile) {
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
	// WalkDir visits in lexical order already; sort anyway so the revision
	// never depends on an fs.FS implementation's order.
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })

	b := &Bundle{}
	h := sha256.New()
	var selftest []byte
	for _, f := range files {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f.data)))
		h.Write([]byte(f.name))
		h.Write([]byte{0})
		h.Write(n[:])
		h.Write(f.data)

		switch {
		case f.name == SelfTestFile:
			selftest = f.data
		case strings.HasSuffix(path.Base(f.name), "_test.rego"):
			b.Tests = append(b.Tests, Module{f.name, string(f.data)})
		default:
			b.Modules = append(b.Modules, Module{f.name, string(f.data)})
		}
	}
	b.Revision = "sha256:" + hex.EncodeToString(h.Sum(nil))

	if len(b.Modules) == 0 {
		return nil, ErrNoModules
	}
	if selftest == nil {
		return nil, fmt.Errorf("%w: %s is missing", ErrNoSelfTest, SelfTestFile)
	}
	if b.Samples, err = parseSamples(selftest); err != nil {
		return nil, err
	}
	return b, nil
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
