package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestJobCommands(t *testing.T) {
	dir := startDevGateway(t)
	acmeInventory(t, dir, "eu-west")
	out := mustCLI(t, dir, "acme-scheduler", "job", "admit", "job-7", "--tenant", "acme",
		"--node", "spiffe://nvmegate.test/node/acme-gpu-1", "--namespace", nqn+"/1:ro", "--region", "eu-west", "--expires-in", "2h")
	if !strings.Contains(out, "job-7") || !strings.Contains(out, "active") || !strings.Contains(out, nqn+"/1:ro") {
		t.Fatalf("admit:\n%s", out)
	}
	if out := mustCLI(t, dir, "acme-scheduler", "job", "list", "--tenant", "acme", "--state", "active"); !strings.Contains(out, "job-7") {
		t.Fatalf("list:\n%s", out)
	}
	out = mustCLI(t, dir, "acme-node-1", "discover", "--job", "job-7")
	if !strings.Contains(out, "host NQN: nqn.2014-08.org.nvmexpress:uuid:") || !strings.Contains(out, "10.0.0.10") || !strings.Contains(out, nqn) {
		t.Fatalf("discover:\n%s", out)
	}
	cfg := filepath.Join(t.TempDir(), "config.json")
	out = mustCLI(t, dir, "acme-node-1", "connect", "--job", "job-7", "--subsystem", nqn, "--write-config", cfg, "--print-connect")
	if !strings.Contains(out, "written to "+cfg) || !strings.Contains(out, "nvme connect") || !strings.Contains(out, "--dhchap-secret") {
		t.Fatalf("connect:\n%s", out)
	}
	if fi, err := os.Stat(cfg); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", fi, err)
	}
	// Without the flags, no secret is printed.
	if out := mustCLI(t, dir, "acme-node-1", "connect", "--job", "job-7", "--subsystem", nqn); strings.Contains(out, "DHHC-1") {
		t.Fatalf("connect printed a secret:\n%s", out)
	}
	// nvme-cli reads the config.json we wrote (CI installs it).
	if nvme, err := exec.LookPath("nvme"); err == nil {
		if out, err := exec.Command(nvme, "config", "-J", cfg, "-O").CombinedOutput(); err != nil {
			t.Fatalf("nvme config -J: %v\n%s", err, out)
		}
	} else if os.Getenv("CI") == "true" {
		t.Fatal("nvme-cli missing under CI")
	}
	// Grants: list, renew, release, revoke.
	var conn struct {
		Grant struct {
			GrantID string `json:"grant_id"`
		}
	}
	out = mustCLI(t, dir, "acme-node-1", "-o", "json", "connect", "--job", "job-7", "--subsystem", nqn)
	if err := json.Unmarshal([]byte(out), &conn); err != nil || conn.Grant.GrantID == "" {
		t.Fatalf("connect -o json: %v\n%s", err, out)
	}
	id := conn.Grant.GrantID
	if out := mustCLI(t, dir, "acme-node-1", "renew", id, "--ttl", "10m"); !strings.Contains(out, id) || !strings.Contains(out, "active") || strings.Contains(out, "DHHC-1") {
		t.Fatalf("renew:\n%s", out)
	}
	if out := mustCLI(t, dir, "acme-node-1", "renew", id, "--print-connect"); !strings.Contains(out, "nvme connect") || !strings.Contains(out, "--dhchap-secret=DHHC-1:") {
		t.Fatalf("renew --print-connect:\n%s", out)
	}
	if out := mustCLI(t, dir, "acme-node-1", "release", id); !strings.Contains(out, "released") {
		t.Fatalf("release:\n%s", out)
	}
	// Each connect superseded the node's previous grant; the last one is
	// released: none is active.
	if out := mustCLI(t, dir, "admin", "grants", "list", "--job", "job-7", "--state", "active"); strings.Count(out, "\n") != 1 {
		t.Fatalf("active grants (header only):\n%s", out)
	}
	if out := mustCLI(t, dir, "admin", "grants", "list", "--job", "job-7", "--state", "released"); strings.Count(out, "\n") != 4 {
		t.Fatalf("released grants (header + 3):\n%s", out)
	}
	mustCLI(t, dir, "acme-node-1", "connect", "--job", "job-7", "--subsystem", nqn)
	if out := mustCLI(t, dir, "admin", "revoke", "--node", "spiffe://nvmegate.test/node/acme-gpu-1", "--reason", "test"); !strings.Contains(out, "revoked 1 grant(s)") {
		t.Fatalf("revoke:\n%s", out)
	}
	if _, err := cli(t, dir, "admin", "revoke", "--job", "job-7", "--node", "x", "--reason", "r"); err == nil {
		t.Fatal("two selectors accepted")
	}
	if _, err := cli(t, dir, "globex-node-1", "discover", "--job", "job-7"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("globex node discovering acme's job: %v", err)
	}
	if _, err := cli(t, dir, "globex-scheduler", "job", "get", "job-7"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("globex reading acme's job: %v", err)
	}
	if out := mustCLI(t, dir, "acme-scheduler", "job", "finish", "job-7", "--reason", "done"); !strings.Contains(out, "finished") {
		t.Fatalf("finish:\n%s", out)
	}
	// The auditor gets the job's lineage and verifies it offline.
	env := mustCLI(t, dir, "auditor", "attest", "lineage", "--job", "job-7")
	lf := filepath.Join(t.TempDir(), "lineage.json")
	if err := os.WriteFile(lf, []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	// The log's public key, as an auditor gets it: from an export.
	exp := filepath.Join(t.TempDir(), "exp")
	mustCLI(t, dir, "auditor", "audit", "export", "--out", exp)
	keys, _ := filepath.Glob(filepath.Join(exp, "keys", "v*.pem"))
	if len(keys) != 1 {
		t.Fatalf("export keys %v", keys)
	}
	out = mustCLI(t, dir, "auditor", "attest", "verify", lf, "--key", keys[0])
	if !strings.Contains(out, "job:       job-7 generation 0 (tenant acme, user (not named))") || !strings.Contains(out, "result:    OK") || !strings.Contains(out, "ds@"+digest) {
		t.Fatalf("attest verify:\n%s", out)
	}
	// A lineage attestation states no time it was made: a freshness bound
	// asked for is refused, not ignored.
	if _, err := cli(t, dir, "auditor", "attest", "verify", lf, "--key", keys[0], "--max-age", "1h"); err == nil || !strings.Contains(err.Error(), "lineage attestation states no time") {
		t.Fatalf("lineage with --max-age: %v", err)
	}
	if err := os.WriteFile(lf, []byte(strings.Replace(env, `"payload": "`, `"payload": "AAAA`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, dir, "auditor", "attest", "verify", lf, "--key", keys[0]); err == nil || !strings.Contains(err.Error(), "verification failed") {
		t.Fatalf("altered lineage: %v", err)
	}
	for name, args := range map[string][]string{
		"bad namespace": {"job", "admit", "j", "--tenant", "acme", "--node", "spiffe://nvmegate.test/node/a", "--namespace", nqn + "/1"},
		"bad mode":      {"job", "admit", "j", "--tenant", "acme", "--node", "spiffe://nvmegate.test/node/a", "--namespace", nqn + "/1:rx"},
		"bad state":     {"job", "list", "--state", "done"},
	} {
		if _, err := cli(t, dir, "acme-scheduler", args...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
