package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/policy"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// startDevGateway runs a real gateway (mTLS, shipped policy, bbolt) on a
// dev trust domain directory, as `nvmegated dev` lays it out, and returns
// the directory.
func startDevGateway(t *testing.T) string {
	t.Helper()
	return startDevGatewayAs(t, "gateway")
}

// startDevGatewayAs serves with the SVID of dev identity serverName.
func startDevGatewayAs(t *testing.T, serverName string) string {
	t.Helper()
	dir := t.TempDir()
	if err := devca.Provision(dir, devca.DevIdentities, time.Now()); err != nil {
		t.Fatal(err)
	}
	td := spiffeid.RequireTrustDomainFromString(devca.DevTrustDomain)
	cert, key := devca.SVIDPaths(dir, serverName)
	src, err := identity.NewFileSource(cert, key, devca.BundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(dir, "inventory.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bundle, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	engine, err := authz.NewEngine(ctx, authz.Options{TrustDomain: td, Bundle: bundle, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := attest.OpenKeyDir(filepath.Join(dir, "audit-keys"), attest.Ed25519, true)
	if err != nil {
		t.Fatal(err)
	}
	alog, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/nvmegate-audit", Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := localstore.Open(filepath.Join(dir, "keys.db"), filepath.Join(dir, "keys.key"))
	if err != nil {
		t.Fatal(err)
	}
	km, err := keys.NewManager(keys.Options{Backend: ks})
	if err != nil {
		t.Fatal(err)
	}
	agent := &targetagent.Agent{Store: db, Keys: km, Driver: func(t *nvmegate.Target) targetagent.Driver {
		return &nvmet.Driver{Root: filepath.Join(dir, "configfs", t.ID)}
	}}
	lc, err := lease.New(lease.Config{Grants: db, Inventory: db, Keys: km, Audit: alog, Targets: agent, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gateway.New(gateway.Config{Credentials: identity.ServerCredentials(src, td), Store: db, Jobs: db, Lease: lc, Audit: alog,
		ExportDir: dir, Keys: km, Targets: agent, LineageSigner: signer, Authorizer: engine, Policy: engine, Compliance: engine, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(devca.ReadyPath(dir), []byte(fmt.Sprintf(`{"grpc":%q}`, lis.Addr().String())), 0o644)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		<-done
		db.Close()
		alog.Close()
		ks.Close()
	})
	return dir
}

// cli runs the real command tree in-process as dev identity who.
func cli(t *testing.T, dir, who string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := newApp(&out, &errOut)
	defer a.close()
	root := a.root()
	root.SetArgs(append([]string{"--dev-dir", dir, "--dev-identity", who}, args...))
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// acmeInventory registers, through the CLI, a target in region with one
// port, acme's subsystem nqn on it and namespace 1 (class internal) in
// region.
func acmeInventory(t *testing.T, dir, region string) {
	t.Helper()
	mustCLI(t, dir, "admin", "inventory", "target", "add", "stor-1", "--fabric", "fab-1", "--region", region,
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420")
	mustCLI(t, dir, "admin", "inventory", "subsystem", "add", nqn, "--target", "stor-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	mustCLI(t, dir, "admin", "inventory", "namespace", "add", nqn, "1", "--tenant", "acme", "--region", region,
		"--class", "internal", "--dataset", "ds", "--digest", digest)
}

func mustCLI(t *testing.T, dir, who string, args ...string) string {
	t.Helper()
	out, err := cli(t, dir, who, args...)
	if err != nil {
		t.Fatalf("nvmegate %s: %v", strings.Join(args, " "), err)
	}
	return out
}

const (
	nqn    = "nqn.2026-01.io.nvmegate.test:acme-train"
	digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestInventoryCommands(t *testing.T) {
	dir := startDevGateway(t)
	mustCLI(t, dir, "admin", "inventory", "target", "add", "stor-eu-1", "--fabric", "fab-eu", "--region", "eu-west",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420",
		"--port", "id=2,transport=tcp,family=ipv6,address=fd00::10,service=4421,secure=required")
	mustCLI(t, dir, "admin", "inventory", "subsystem", "add", nqn, "--target", "stor-eu-1", "--tenant", "acme", "--ports", "1,2", "--dhchap", "--tls")
	mustCLI(t, dir, "admin", "inventory", "namespace", "add", nqn, "7", "--tenant", "acme", "--region", "eu-west",
		"--class", "immutable", "--dataset", "common-crawl/2026-10", "--digest", digest, "--max-mbps", "500")
	mustCLI(t, dir, "admin", "inventory", "host", "add", "spiffe://nvmegate.test/node/acme-gpu-1",
		"--nqn", "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000", "--tenant", "acme")

	// Table output.
	out := mustCLI(t, dir, "admin", "inventory", "target", "list")
	if !strings.Contains(out, "stor-eu-1") || !strings.Contains(out, "2:tcp://[fd00::10]:4421(tls required)") {
		t.Fatalf("target list:\n%s", out)
	}
	// JSON output is the API message.
	out = mustCLI(t, dir, "admin", "-o", "json", "inventory", "namespace", "get", nqn, "7")
	var ns struct {
		Namespace struct {
			Nsid      int    `json:"nsid"`
			DataClass string `json:"data_class"`
			Dataset   struct{ Digest string }
			Qos       struct {
				MaxMbps string `json:"max_mbps"`
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &ns); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if ns.Namespace.Nsid != 7 || ns.Namespace.DataClass != "immutable" || ns.Namespace.Dataset.Digest != digest || ns.Namespace.Qos.MaxMbps != "500" {
		t.Fatalf("namespace JSON: %+v", ns)
	}
	out = mustCLI(t, dir, "admin", "inventory", "host", "get", "spiffe://nvmegate.test/node/acme-gpu-1")
	if !strings.Contains(out, "00000001-aaaa") || !strings.Contains(out, "acme") {
		t.Fatalf("host get:\n%s", out)
	}

	// Errors carry the gRPC code and the gateway's message.
	_, err := cli(t, dir, "admin", "inventory", "subsystem", "remove", nqn)
	if err == nil || !strings.HasPrefix(err.Error(), "FailedPrecondition:") {
		t.Fatalf("remove a subsystem with namespaces: %v", err)
	}
	_, err = cli(t, dir, "acme-node-1", "inventory", "namespace", "list")
	if err == nil || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "role node") {
		t.Fatalf("node listing namespaces: %v", err)
	}
	_, err = cli(t, dir, "admin", "inventory", "target", "add", "x", "--fabric", "f", "--region", "r", "--port", "id=1,transport=tcp,family=ipv4,address=1.2.3.4,service=0")
	if err == nil || !strings.Contains(err.Error(), "target.ports[0].service_id") {
		t.Fatalf("bad port: %v", err)
	}

	// Removal in order works.
	// A plain remove says what became of the data key (none was made:
	// the namespace has no backing device).
	if out := mustCLI(t, dir, "admin", "inventory", "namespace", "remove", nqn, "7"); !strings.Contains(out, "data key none:") {
		t.Fatalf("namespace remove says nothing of the data key:\n%s", out)
	}
	mustCLI(t, dir, "admin", "inventory", "subsystem", "remove", nqn)
	mustCLI(t, dir, "admin", "inventory", "target", "remove", "stor-eu-1")
	if out := mustCLI(t, dir, "admin", "inventory", "target", "list"); strings.Contains(out, "stor-eu-1") {
		t.Fatalf("target still listed:\n%s", out)
	}
}

func TestCLIUsageErrors(t *testing.T) {
	dir := startDevGateway(t)
	for name, tc := range map[string]struct {
		who  string
		args []string
		want string
	}{
		"bad output":       {"admin", []string{"-o", "yaml", "inventory", "target", "list"}, "-o must be table or json"},
		"unknown identity": {"nobody", []string{"inventory", "target", "list"}, `no dev identity "nobody"`},
		"bad port syntax":  {"admin", []string{"inventory", "target", "add", "t", "--port", "id=1,colour=red"}, `unknown key "colour"`},
		"bad nsid":         {"admin", []string{"inventory", "namespace", "get", nqn, "seven"}, "NSID"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := cli(t, dir, tc.who, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	// No identity at all.
	a := newApp(io.Discard, io.Discard)
	root := a.root()
	root.SetArgs([]string{"--addr", "127.0.0.1:1", "inventory", "target", "list"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "an identity is required") {
		t.Fatalf("no identity: %v", err)
	}
}

// A server with another workload's SVID (here a node's) is not the gateway:
// the CLI refuses it in the handshake, before sending anything.
func TestCLIRefusesNonGatewayServer(t *testing.T) {
	dir := startDevGatewayAs(t, "acme-node-2")
	_, err := cli(t, dir, "admin", "inventory", "target", "list")
	if err == nil || !strings.Contains(err.Error(), "Unavailable") || !strings.Contains(err.Error(), "not a gateway") {
		t.Fatalf("admin against a node posing as the gateway: %v", err)
	}
	// --server-id naming that workload exactly is the operator's explicit
	// choice, and is honoured.
	if _, err := cli(t, dir, "admin", "--server-id", "spiffe://nvmegate.test/node/acme-gpu-2", "inventory", "target", "list"); err != nil {
		t.Fatalf("explicit --server-id: %v", err)
	}
}
