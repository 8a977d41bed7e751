package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/audit"
)

// The auditor's workflow through the CLI: query, checkpoint, proofs checked
// against the signed checkpoint, export, offline verification; and the
// verifier names a tampered entry.
func TestAuditCommands(t *testing.T) {
	dir := startDevGateway(t)
	mustCLI(t, dir, "admin", "inventory", "target", "add", "stor-eu-1", "--fabric", "fab-eu", "--region", "eu-west",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420")
	if _, err := cli(t, dir, "acme-node-1", "inventory", "target", "add", "x", "--fabric", "f", "--region", "eu-west",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420"); err == nil {
		t.Fatal("node added a target")
	}
	before := filepath.Join(t.TempDir(), "cp1")
	mustCLI(t, dir, "auditor", "audit", "checkpoint", "--out", before)
	mustCLI(t, dir, "admin", "inventory", "target", "remove", "stor-eu-1")

	out := mustCLI(t, dir, "auditor", "audit", "query")
	for _, want := range []string{"inventory_change", "deny", "inventory.add_target stor-eu-1", "inventory.remove_target stor-eu-1", "spiffe://nvmegate.test/node/acme-gpu-1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("query output lacks %q:\n%s", want, out)
		}
	}
	out = mustCLI(t, dir, "auditor", "-o", "json", "audit", "query", "--kind", "deny")
	var q struct{ Entries []struct{ Kind string } }
	if err := json.Unmarshal([]byte(out), &q); err != nil || len(q.Entries) != 1 || q.Entries[0].Kind != "deny" {
		t.Fatalf("query --kind deny: %v\n%s", err, out)
	}
	if _, err := cli(t, dir, "acme-scheduler", "audit", "query"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("scheduler reading the log: %v", err)
	}

	keys, err := filepath.Glob(filepath.Join(dir, "audit-keys", "*"))
	if err != nil || len(keys) == 0 {
		t.Fatalf("no key files: %v", err)
	}
	// Export first: it signs a checkpoint over everything so far (the
	// scheduler's refusal included).
	exp := filepath.Join(t.TempDir(), "export")
	out = mustCLI(t, dir, "auditor", "audit", "export", "--out", exp)
	if !strings.Contains(out, "tree size 4") {
		t.Fatalf("export: %s", out)
	}
	pubs, err := filepath.Glob(filepath.Join(exp, "keys", "v*.pem"))
	if err != nil || len(pubs) != 1 {
		t.Fatalf("export keys: %v %v", pubs, err)
	}
	out = mustCLI(t, dir, "auditor", "audit", "proof", "inclusion", "--index", "1", "--key", pubs[0])
	if !strings.Contains(out, "verified against the signed checkpoint") {
		t.Fatalf("inclusion proof: %s", out)
	}
	out = mustCLI(t, dir, "auditor", "audit", "proof", "consistency", "--since", before, "--key", pubs[0])
	if !strings.Contains(out, "verified: the signed log extends the saved checkpoint") {
		t.Fatalf("consistency proof: %s", out)
	}
	if _, err := cli(t, dir, "auditor", "audit", "proof", "consistency", "--since", before); err == nil || !strings.Contains(err.Error(), "needs --key") {
		t.Fatalf("--since without --key: %v", err)
	}

	out = mustCLI(t, dir, "auditor", "audit", "verify", exp, "--key", pubs[0], "--since", before)
	if !strings.Contains(out, "result:       OK") || !strings.Contains(out, "entries:      4 checked") {
		t.Fatalf("verify:\n%s", out)
	}
	// Tamper with one entry of the export: the verifier fails and names it.
	bundle := filepath.Join(exp, filepath.FromSlash(audit.EntryBundlePath(0, 4)))
	data, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(data), "remove_target")
	if i < 0 {
		t.Fatal("entry not found in the bundle")
	}
	copy(data[i:], "delete_target")
	if err := os.WriteFile(bundle, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = cli(t, dir, "auditor", "-o", "json", "audit", "verify", exp, "--key", pubs[0])
	if err == nil || !strings.Contains(err.Error(), "verification failed") {
		t.Fatalf("tampered export verified: %v", err)
	}
	var rep audit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !rep.Has(audit.KindModifiedEntry) || rep.Failures[0].Index == nil || *rep.Failures[0].Index != 2 {
		t.Fatalf("report: %+v", rep.Failures)
	}
	// Usage errors.
	if _, err := cli(t, dir, "auditor", "audit", "verify", exp); err == nil || !strings.Contains(err.Error(), "--key is required") {
		t.Fatalf("verify without keys: %v", err)
	}
	if _, err := cli(t, dir, "auditor", "audit", "export", "--out", exp); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("export into a non-empty dir: %v", err)
	}
}

func TestExportPathRefusesEscapes(t *testing.T) {
	for _, p := range []string{"", "../x", "/etc/passwd", "a/../../b", `tile\..\x`, "a//b", "./a"} {
		if _, err := exportPath("/out", p); err == nil {
			t.Errorf("exportPath(%q) accepted", p)
		}
	}
	if got, err := exportPath("/out", "tile/entries/000.p/3"); err != nil || got != filepath.Join("/out", "tile/entries/000.p/3") {
		t.Errorf("exportPath: %q %v", got, err)
	}
}

// `attest compliance` writes a bundle that `attest verify` checks offline
// with the log's key, printing what it states.
func TestAttestCompliance(t *testing.T) {
	dir := startDevGateway(t)
	acmeInventory(t, dir, "eu-west")
	bundle := mustCLI(t, dir, "auditor", "attest", "compliance")
	f := filepath.Join(t.TempDir(), "compliance.json")
	if err := os.WriteFile(f, []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	exp := filepath.Join(t.TempDir(), "export")
	mustCLI(t, dir, "auditor", "audit", "export", "--out", exp)
	pubs, err := filepath.Glob(filepath.Join(exp, "keys", "v*.pem"))
	if err != nil || len(pubs) != 1 {
		t.Fatalf("export keys: %v %v", pubs, err)
	}
	out := mustCLI(t, dir, "auditor", "attest", "verify", f, "--key", pubs[0])
	if !strings.Contains(out, "1 namespace(s)") || !strings.Contains(out, "out of compliance: nothing") || !strings.Contains(out, "result:            OK") {
		t.Fatalf("verify:\n%s", out)
	}
	if first, _, _ := strings.Cut(out, "\n"); !strings.HasPrefix(first, "issued:            ") ||
		!strings.HasSuffix(first, " (just now)") && !strings.HasSuffix(first, "s ago)") {
		t.Fatalf("verify: the first line is not the issue time and age:\n%s", out)
	}
	if err := os.WriteFile(f, []byte(strings.Replace(bundle, `"index": `, `"index": 1`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, dir, "auditor", "attest", "verify", f, "--key", pubs[0]); err == nil || !strings.Contains(err.Error(), "verification failed") {
		t.Fatalf("tampered bundle: %v", err)
	}
	if _, err := cli(t, dir, "acme-node-1", "attest", "compliance"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("a node asking: %v", err)
	}
}

// `audit report --job` writes one HTML page of the job's entries, the log
// verified first; from the gateway (an export made for it) and from an
// export directory alike.
func TestAuditReport(t *testing.T) {
	dir := startDevGateway(t)
	acmeInventory(t, dir, "eu-west")
	mustCLI(t, dir, "acme-scheduler", "job", "admit", "job-7", "--tenant", "acme",
		"--node", "spiffe://nvmegate.test/node/acme-gpu-1", "--namespace", nqn+"/1:ro", "--region", "eu-west", "--expires-in", "2h")
	mustCLI(t, dir, "acme-node-1", "connect", "--job", "job-7", "--subsystem", nqn)
	exp := filepath.Join(t.TempDir(), "export")
	mustCLI(t, dir, "auditor", "audit", "export", "--out", exp)
	key := filepath.Join(exp, "keys", "v1.pem")
	for _, extra := range [][]string{nil, {"--export", exp}} {
		page := filepath.Join(t.TempDir(), "report.html")
		out := mustCLI(t, dir, "auditor", append([]string{"audit", "report", "--job", "job-7", "--html", page, "--key", key}, extra...)...)
		if !strings.Contains(out, "verified; written to") {
			t.Fatalf("report %v: %s", extra, out)
		}
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		if html := string(b); !strings.Contains(html, `id="verdict">Verified<`) || strings.Count(html, `<rect class="grant`) != 1 {
			t.Fatalf("report %v: no verdict or not one bar for the one grant", extra)
		}
	}
	if _, err := cli(t, dir, "auditor", "audit", "report", "--html", "x.html", "--key", key); err == nil || !strings.Contains(err.Error(), "--job or --tenant") {
		t.Fatalf("no selection: %v", err)
	}
	if _, err := cli(t, dir, "acme-scheduler", "audit", "report", "--job", "job-7", "--html", filepath.Join(t.TempDir(), "r.html"), "--key", key); err == nil {
		t.Fatal("a scheduler exported the log for a report")
	}
}
