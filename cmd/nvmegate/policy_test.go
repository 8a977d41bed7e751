package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/policy"
)

const nodeAddTarget = `{
  "caller": {"id": "spiffe://nvmegate.test/node/acme-gpu-1", "trust_domain": "nvmegate.test", "role": "node", "tenant": "", "name": "acme-gpu-1"},
  "rpc": {"service": "nvmegate.v1.Inventory", "method": "AddTarget", "full_method": "/nvmegate.v1.Inventory/AddTarget"},
  "action": "inventory.add_target", "resource": {"kind": "target", "tenant": ""},
  "time": "2026-12-02T10:00:00Z", "gateway": {"trust_domain": "nvmegate.test"}}`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyExplainAndStatus(t *testing.T) {
	dir := startDevGateway(t)
	in := writeFile(t, "input.json", nodeAddTarget)
	out := mustCLI(t, dir, "admin", "policy", "explain", "--input", in)
	if !strings.HasPrefix(out, "DENY") || !strings.Contains(out, "  - ") {
		t.Fatalf("explain:\n%s", out)
	}
	out = mustCLI(t, dir, "admin", "-o", "json", "policy", "explain", "--input", in)
	var doc struct {
		Allow    *bool          `json:"allow"`
		Reasons  []string       `json:"reasons"`
		ID       string         `json:"decision_id"`
		Document map[string]any `json:"document"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || doc.Allow == nil || *doc.Allow || doc.ID == "" || doc.Document["reasons"] == nil {
		t.Fatalf("explain -o json: %v\n%s", err, out)
	}
	if _, err := cli(t, dir, "acme-node-1", "policy", "explain", "--input", in); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("a node explaining: %v", err)
	}
	if _, err := cli(t, dir, "admin", "policy", "explain", "--input", writeFile(t, "bad.json", "[1]")); err == nil || !strings.Contains(err.Error(), "not a JSON object") {
		t.Fatalf("bad input: %v", err)
	}
	if out := mustCLI(t, dir, "admin", "policy", "status"); !strings.Contains(out, "sha256:") {
		t.Fatalf("status:\n%s", out)
	}
}

func TestPolicyEvalOffline(t *testing.T) {
	pdir := t.TempDir()
	err := os.CopyFS(pdir, policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	in := writeFile(t, "input.json", nodeAddTarget)
	out, err := offline(t, "", "policy", "eval", "--policy", pdir, "--input", in)
	if err != nil || !strings.HasPrefix(out, "DENY") {
		t.Fatalf("eval: %q %v", out, err)
	}
	// Extra data merges under its own key without disturbing the decision.
	data := writeFile(t, "data.json", `{"site": {"owner": "storage-security"}}`)
	if out, err := offline(t, "", "policy", "eval", "--policy", pdir, "--input", in, "--data", data); err != nil || !strings.HasPrefix(out, "DENY") {
		t.Fatalf("eval --data: %q %v", out, err)
	}
	if _, err := offline(t, "", "policy", "eval", "--policy", pdir, "--input", in, "--data", writeFile(t, "d.json", `{"x": 1}`)); err == nil {
		t.Fatal("non-object data accepted")
	}
	// A broken policy directory is refused like the gateway refuses it.
	os.WriteFile(filepath.Join(pdir, "broken.rego"), []byte("package nvmegate.authz\n\nx := {"), 0o644)
	if _, err := offline(t, "", "policy", "eval", "--policy", pdir, "--input", in); err == nil || !strings.Contains(err.Error(), "compile") {
		t.Fatalf("broken policy: %v", err)
	}
}

// `policy impact` lists what a candidate directory would revoke, and with
// --fail-on-revoke fails; an unchanged candidate passes either way.
func TestPolicyImpact(t *testing.T) {
	dir := startDevGateway(t)
	acmeInventory(t, dir, "us-west")
	mustCLI(t, dir, "acme-scheduler", "job", "admit", "job-7", "--tenant", "acme",
		"--node", "spiffe://nvmegate.test/node/acme-gpu-1", "--namespace", nqn+"/1:ro", "--region", "us-west", "--expires-in", "2h")
	mustCLI(t, dir, "acme-node-1", "connect", "--job", "job-7", "--subsystem", nqn)

	candidate := t.TempDir()
	if err := os.CopyFS(candidate, policy.Default()); err != nil {
		t.Fatal(err)
	}
	if out := mustCLI(t, dir, "admin", "policy", "impact", "--candidate", candidate, "--fail-on-revoke"); !strings.Contains(out, "0 would be revoked") {
		t.Fatalf("unchanged candidate:\n%s", out)
	}
	data := filepath.Join(candidate, "data.json")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	moved := strings.Replace(string(b), `"us-west":    {"target_regions": ["us-west", "us-east"]}`, `"us-west":    {"target_regions": ["us-east"]}`, 1)
	if moved == string(b) {
		t.Fatal("data.json no longer has us-west's residency")
	}
	if err := os.WriteFile(data, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	out := mustCLI(t, dir, "admin", "policy", "impact", "--candidate", candidate)
	if !strings.Contains(out, "revoke") || !strings.Contains(out, "job-7") || !strings.Contains(out, "1 would be revoked") || !strings.Contains(out, "region us-west") {
		t.Fatalf("impact:\n%s", out)
	}
	if _, err := cli(t, dir, "admin", "policy", "impact", "--candidate", candidate, "--fail-on-revoke"); err == nil || !strings.Contains(err.Error(), "would revoke 1") {
		t.Fatalf("--fail-on-revoke: %v", err)
	}
	if _, err := cli(t, dir, "acme-scheduler", "policy", "impact", "--candidate", candidate); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("a scheduler asking: %v", err)
	}
}
