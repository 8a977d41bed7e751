// Package policy holds nvmegate's Rego policy: the sources, their tests, the
// startup self-test samples, and a loader that turns a directory of them into
// a Bundle the authz engine compiles.
//
// The default policy is embedded in the binary (Default); a site can load its
// own from any fs.FS with Load, e.g. Load(os.DirFS("/etc/nvmegate/policy")).
// A bundle directory holds:
//
//	*.rego          policy modules (package nvmegate.authz and helpers), in
//	                Rego v1 syntax; subdirectories are walked
//	*_test.rego     tests in `opa test` style; kept apart (Bundle.Tests) and
//	                never compiled into the serving engine
//	selftest.json   required: sample inputs with the expected outcome, which
//	                the engine evaluates after compiling and before serving
//	                (a policy that decides any sample differently never loads)
//
// Other files are ignored, so the package directory itself loads: the
// embedded bundle and os.DirFS("policy") have the same revision.
//
// The same files work with the standard tools: `opa test policy/` runs the
// tests (opa also loads selftest.json, as the data document data.samples,
// which the policy does not read), and `go test ./policy/` runs them through
// OPA's tester package.
//
// # selftest.json
//
//	{"samples": [
//	  {"name": "admin may add a target",
//	   "input": {...one input document, see authz/doc.go...},
//	   "allow": true,
//	   "reasons": ["role admin may call nvmegate.v1.Inventory"]},
//	  ...
//	]}
//
// Every sample needs a unique name, an input object and allow; reasons is
// optional and, when present, must equal the decision's reasons exactly.
// A bundle needs at least one allowing and one denying sample, so neither an
// allow-all nor a deny-all policy passes its self-test.
//
// # Revision
//
// Bundle.Revision identifies the content: "sha256:" and the hex SHA-256 over
// every loaded file (modules, tests, selftest.json) in path order, each as
// its path, a NUL byte, its length as 8 big-endian bytes and its bytes. Any
// change to any loaded file changes the revision; the decision log and audit
// entries record it.
package policy
