package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
	"github.com/nvmegate/nvmegate/loadgen"
)

// Vault stops answering under load (SIGSTOP: requests hang, the harder
// case): the gateway keeps issuing from its cached roots for at most
// keys.max_staleness, then refuses every connect Unavailable (fail closed),
// and serves again by itself once Vault answers. Every grant acknowledged on
// the way is in the audit log.
func TestVaultOutageUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	needVault(t)
	bin := buildBinaries(t)
	v := vaulttest.Start(t)
	work := t.TempDir()
	role := v.SetUpAppRole(t, filepath.Join(work, "approle"))
	keepSecret(t.Name()+": the AppRole secret ID", role.SecretID)
	keepSecret(t.Name()+": the Vault token", v.Token)
	const staleness = 4 * time.Second
	cfg := filepath.Join(work, "nvmegated.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`keys:
  backend: vault
  refresh_interval: 500ms
  max_staleness: %s
  vault:
    address: %s
    approle:
      role_id: %s
      secret_id_file: %s
`, staleness, v.Addr, role.RoleID, role.SecretIDFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "dev")
	startGateway(t, bin, dir, "--config", cfg)

	ctx := context.Background()
	dial := func(who string) *grpc.ClientConn {
		conn, src, err := clientconn.Dial(ctx, clientconn.Options{DevDir: dir, DevIdentity: who})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(); src.Close() })
		return conn
	}
	ca, err := devca.Load(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	addr, err := clientconn.DevAddr(dir)
	if err != nil {
		t.Fatal(err)
	}
	env := loadgen.Env{Addr: addr, Admin: dial("admin"), Scheduler: dial("acme-scheduler"), Auditor: dial("auditor"), CA: ca}
	o := loadgen.Options{Nodes: 16, Namespaces: 4, Concurrency: 4, JobSize: 16, Tenant: "acme", Region: "eu-west", RunID: "vault"}
	fleet, err := loadgen.Setup(ctx, env, o)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	var acks []loadgen.Ack
	run := func(d time.Duration) *loadgen.Result {
		o.Duration = d
		r := loadgen.Run(ctx, fleet, o)
		acks = append(acks, r.Acks...)
		return r
	}
	if r := run(time.Second); r.ErrorCount() != 0 || len(r.Latencies) == 0 {
		t.Fatalf("before the outage:\n%s", loadgen.Summary(r))
	}

	v.Pause()
	paused := time.Now()
	// Degraded: the cached roots serve.
	if r := run(500 * time.Millisecond); len(r.Latencies) == 0 {
		t.Fatalf("right after Vault stopped, nothing was granted (want the cached roots to serve):\n%s", loadgen.Summary(r))
	}
	// Then closed: past the staleness bound nothing is granted, and the
	// refusals say Unavailable.
	var closed *loadgen.Result
	for deadline := time.Now().Add(staleness + 30*time.Second); ; {
		r := run(500 * time.Millisecond)
		if len(r.Latencies) == 0 && r.ErrorCount() > 0 {
			closed = r
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still granting %s after Vault stopped (max_staleness %s):\n%s", time.Since(paused).Round(time.Second), staleness, loadgen.Summary(r))
		}
	}
	closedAfter := time.Since(paused)
	if closedAfter < staleness-time.Second {
		t.Errorf("closed after %s, before the staleness bound %s", closedAfter, staleness)
	}
	if len(closed.Errors) != 1 || closed.Errors["Unavailable"] == 0 {
		t.Errorf("refusals with Vault gone, want only Unavailable:\n%s", loadgen.Summary(closed))
	}
	t.Logf("Vault stopped: granting from the cache, closed after %s:\n%s", closedAfter.Round(100*time.Millisecond), loadgen.Summary(closed))

	v.Resume()
	resumed := time.Now()
	for deadline := time.Now().Add(60 * time.Second); ; {
		r := run(500 * time.Millisecond)
		if r.ErrorCount() == 0 && len(r.Latencies) > 0 {
			t.Logf("serving again %s after Vault came back", time.Since(resumed).Round(100*time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not serving 60 s after Vault came back:\n%s", loadgen.Summary(r))
		}
	}
	missing, err := loadgen.Verify(ctx, env, acks)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d acknowledged grants missing from the log", len(missing), len(acks))
	}
}

// needVault skips a test without the Vault binary make test builds —
// except under CI, where a missing Vault must fail the run.
func needVault(t testing.TB) {
	t.Helper()
	if vaulttest.Binary() == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("no Vault binary under CI (make test builds it)")
		}
		t.Skip("no Vault binary: make test builds it with scripts/build-vault.sh")
	}
}
