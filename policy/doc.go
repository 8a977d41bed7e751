// Package policy holds nvmegate's Rego policy: the sources, their data,
// their tests, the startup self-test samples, and a loader that turns a
// directory or bundle file of them into a Bundle the authz engine compiles.
// README.md in this directory documents the input and data schemas and every
// rule with its reasons.
//
// The default policy is embedded in the binary (Default). A site loads its
// own with LoadDir("/etc/nvmegate/policy"), LoadBundleFile("bundle.tar.gz"),
// or Load(fsys) for any fs.FS. A bundle directory holds:
//
//	*.rego          policy modules (package nvmegate.authz and helpers), in
//	                Rego v1 syntax; subdirectories are walked
//	*_test.rego     tests in `opa test` style; kept apart (Bundle.Tests) and
//	                never compiled into the serving engine
//	data.json       data, at the data path of its directory (OPA bundle
//	                convention): the root data.json is data, sites/eu/data.json
//	                is data.sites.eu; all are merged into Bundle.Data, and two
//	                files that define the same key are refused (ErrData)
//	selftest.json   at the root, required: sample inputs with the expected
//	                outcome, which the engine evaluates after compiling and
//	                before serving (a policy that decides any sample
//	                differently never loads)
//	.manifest       at the root, optional: an OPA bundle manifest whose
//	                "revision" names the bundle; rego_version must be 1 if set
//
// Other files, and hidden ones (editor files, the ..data directories of a
// Kubernetes ConfigMap mount), are ignored, so the package directory itself
// loads: the embedded bundle and LoadDir("policy") have the same revision.
//
// The same files work with the standard tools: `opa test policy/` runs the
// tests with data.json (and selftest.json, as data.samples, which the tests
// decide), and `go test ./policy/` runs them through OPA's tester.
//
// # selftest.json
//
//	{"samples": [
//	  {"name": "admin may add a target",
//	   "input": {...one input document, see README.md...},
//	   "allow": true,
//	   "reasons": ["role admin may perform inventory.add_target"]},
//	  ...
//	]}
//
// Every sample needs a unique name, an input object and allow; reasons is
// optional and, when present, must equal the decision's reasons exactly.
// A bundle needs at least one allowing and one denying sample, so neither an
// allow-all nor a deny-all policy passes its self-test. A bundle file built
// by `opa build` (which turns selftest.json into the data document
// "samples") may carry its samples there instead.
//
// # Revision
//
// Bundle.Digest identifies the content: "sha256:" and the hex SHA-256 over
// every loaded file (modules, tests, data files, selftest.json, .manifest)
// in path order, each as its path, a NUL byte, its length as 8 big-endian
// bytes and its bytes. Any change to any loaded file changes it.
// Bundle.Revision is the manifest's revision if it sets one, else the
// digest; decisions, logs and audit entries record it. Compare digests, not
// revisions, to tell whether files changed.
package policy
