package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// runDev runs the real daemon in dev mode on :0 with a temp dir. It returns
// once Open has bound the listeners: no sleeping for readiness.
func runDev(t *testing.T) (*Main, string) {
	t.Helper()
	dir := t.TempDir()
	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return after cancel")
		}
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, err := os.Stat(devca.ReadyPath(dir)); !os.IsNotExist(err) {
			t.Errorf("ready file left behind: %v", err)
		}
	})
	return m, dir
}

// devConn dials the gateway as dev identity name, through the files the dev
// mode wrote.
func devConn(t *testing.T, addr, dir, name string) *grpc.ClientConn {
	t.Helper()
	cert, key := devca.SVIDPaths(dir, name)
	src, err := identity.NewFileSource(cert, key, devca.BundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	gw := spiffeid.RequireFromString("spiffe://nvmegate.test/gateway/nvmegated")
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(identity.ClientCredentials(src, tlsconfig.AuthorizeID(gw))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDevDaemon(t *testing.T) {
	m, dir := runDev(t)

	// The ready file names the bound addresses.
	var ready ReadyInfo
	data, err := os.ReadFile(devca.ReadyPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &ready); err != nil || ready.GRPC != m.GRPCAddr() || ready.HTTP != m.HTTPAddr() || ready.TrustDomain != "nvmegate.test" {
		t.Fatalf("ready file %s (%v)", data, err)
	}

	// Every dev identity exists; the admin manages the inventory, a node may not.
	for _, id := range devca.DevIdentities {
		if _, err := os.Stat(filepath.Join(dir, "svid", id.Name+".pem")); err != nil {
			t.Fatalf("dev identity %s: %v", id.Name, err)
		}
	}
	target := &pb.Target{Id: "stor-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}
	if _, err := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin")).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: target}); err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1")).ListTargets(ctxT(t), &pb.ListTargetsRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node ListTargets: %v, want PermissionDenied", err)
	}

	// Health and metrics on the HTTP listener.
	body := httpGet(t, "http://"+m.HTTPAddr()+"/healthz", http.StatusOK)
	if strings.TrimSpace(body) != "ok" {
		t.Fatalf("/healthz = %q", body)
	}
	metrics := httpGet(t, "http://"+m.HTTPAddr()+"/metrics", http.StatusOK)
	for _, want := range []string{
		`nvmegate_grpc_requests_total{code="OK",method="/nvmegate.v1.Inventory/AddTarget"} 1`,
		`nvmegate_grpc_requests_total{code="PermissionDenied",method="/nvmegate.v1.Inventory/ListTargets"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func httpGet(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// Replacing the gateway's SVID files while a client is connected: new
// connections get the new SVID, the old connection keeps working, and the
// daemon is never restarted.
func TestSVIDFileRotation(t *testing.T) {
	m, dir := runDev(t)
	serverCert := func(conn *grpc.ClientConn) *x509.Certificate {
		t.Helper()
		var p peer.Peer
		if _, err := pb.NewPolicyClient(conn).Status(ctxT(t), &pb.PolicyStatusRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		return p.AuthInfo.(identity.AuthInfo).State.PeerCertificates[0]
	}
	old := devConn(t, m.GRPCAddr(), dir, "admin")
	before := serverCert(old)

	ca, err := devca.Load(filepath.Join(dir, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	svid, err := ca.Issue(spiffeid.RequireFromString("spiffe://nvmegate.test/gateway/nvmegated"), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := devca.WriteSVID(filepath.Join(dir, "svid"), "gateway", svid); err != nil {
		t.Fatal(err)
	}

	after := serverCert(devConn(t, m.GRPCAddr(), dir, "admin"))
	if after.SerialNumber.Cmp(svid.Certificates[0].SerialNumber) != 0 {
		t.Fatalf("new connection got serial %x, want the rotated %x", after.SerialNumber, svid.Certificates[0].SerialNumber)
	}
	if again := serverCert(old); again.SerialNumber.Cmp(before.SerialNumber) != 0 {
		t.Fatalf("the old connection changed certificate")
	}
}

func TestConfigFileAndFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "nvmegated.yaml")
	os.WriteFile(cfg, []byte("listen: 127.0.0.1:9999\ntrust_domain: example.org\nstate_dir: /var/lib/x\nidentity:\n  spiffe_socket: unix:///run/spire.sock\nlog: {format: json}\n"), 0o644)
	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), []string{"--config", cfg, "--listen", "127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	c := m.Config
	if c.Listen != "127.0.0.1:0" || c.TrustDomain != "example.org" || c.Log.Format != "json" || c.Log.Level != "info" || c.HTTPListen != "127.0.0.1:7080" {
		t.Fatalf("config = %+v", c)
	}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}

	os.WriteFile(cfg, []byte("listen: x\ntrust_domian: typo.org\n"), 0o644)
	if err := NewMain().ParseFlags(context.Background(), []string{"--config", cfg}); err == nil || !strings.Contains(err.Error(), "trust_domian") {
		t.Fatalf("unknown field: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	base := Config{TrustDomain: "example.org", StateDir: "/s", Identity: IdentityConfig{SPIFFESocket: "unix:///s"}}
	for name, tc := range map[string]struct {
		mut  func(*Config)
		want string
	}{
		"no trust domain":  {func(c *Config) { c.TrustDomain = "" }, "trust_domain is required"},
		"bad trust domain": {func(c *Config) { c.TrustDomain = "Not Valid" }, "trust_domain"},
		"no state dir":     {func(c *Config) { c.StateDir = "" }, "state_dir"},
		"no identity":      {func(c *Config) { c.Identity = IdentityConfig{} }, "spiffe_socket or cert"},
		"both identities":  {func(c *Config) { c.Identity.Cert = "x" }, "not both"},
		"partial files":    {func(c *Config) { c.Identity = IdentityConfig{Cert: "c", Key: "k"} }, "must all be set"},
		"log format":       {func(c *Config) { c.Log.Format = "xml" }, "log.format"},
		"keys backend":     {func(c *Config) { c.Keys.Backend = "hsm" }, "keys.backend"},
		"zero grace":       {func(c *Config) { c.Keys.Grace = "0s" }, "keys.grace"},
		"slow refresh":     {func(c *Config) { c.Keys.RefreshInterval = "10m" }, "at most half of keys.max_staleness"},
		"zero rotation":    {func(c *Config) { c.Keys.RotationPeriod = "0s" }, "keys.rotation_period"},
		"audit algorithm":  {func(c *Config) { c.Audit.Algorithm = "rsa" }, "audit.algorithm"},
		"checkpoint every": {func(c *Config) { c.Audit.CheckpointInterval = "2h" }, "audit.checkpoint_interval"},
		"memory limit":     {func(c *Config) { c.Runtime.MemoryLimit = "1GB" }, "runtime.memory_limit"},
		"memory limit 0":   {func(c *Config) { c.Runtime.MemoryLimit = "0MiB" }, "runtime.memory_limit"},
		"memory overflow":  {func(c *Config) { c.Runtime.MemoryLimit = "9999999999TiB" }, "runtime.memory_limit"},
		"ack timeout":      {func(c *Config) { c.Targets.AckTimeout = "10ms" }, "targets.ack_timeout"},
		"etcd local keys":  {func(c *Config) { c.Etcd.Endpoints = []string{"https://etcd:2379"} }, "set keys.backend to vault"},
		"etcd partial tls": {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, CACert: "ca"} }, "all be set (mTLS)"},
		"etcd prefix":      {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, Prefix: "/x"} }, "etcd.prefix"},
		"etcd lease":       {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, LeaseTTL: -1} }, "etcd.lease_ttl"},
		"group wait":       {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, LogGroupWait: "1s"} }, "etcd.log_group_wait"},
		"group wait zero":  {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, LogGroupWait: "0s"} }, "etcd.log_group_wait"},
		"group wait word":  {func(c *Config) { c.Etcd = EtcdConfig{Endpoints: []string{"e"}, LogGroupWait: "none"} }, "etcd.log_group_wait"},
		"identity share":   {func(c *Config) { c.MaxInFlightPerIdentity = 257 }, "at most max_inflight (256)"},
		"identity share -": {func(c *Config) { c.MaxInFlight, c.MaxInFlightPerIdentity = 64, -2 }, "max_inflight_per_identity"},
		"role share name":  {func(c *Config) { c.MaxInFlightPerRole = map[string]int{"auditors": 8} }, `no role "auditors"`},
		"role share zero":  {func(c *Config) { c.MaxInFlightPerRole = map[string]int{"auditor": 0} }, "max_inflight_per_role.auditor must be positive"},
	} {
		t.Run(name, func(t *testing.T) {
			c := base
			c.setDefaults()
			tc.mut(&c)
			if err := c.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate() = %v, want %q", err, tc.want)
			}
		})
	}
	// The defaults are valid, and a negative period turns scheduled
	// rotation off.
	c := base
	c.Keys.RotationPeriod = "-1s"
	c.setDefaults()
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	// Shares: set, or lifted with -1.
	c.MaxInFlight, c.MaxInFlightPerIdentity, c.MaxInFlightPerRole = 64, 64, map[string]int{"auditor": 8, "node": 48, "unknown": -1}
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
	c.MaxInFlightPerIdentity = -1
	if err := c.validate(); err != nil {
		t.Fatal(err)
	}
}

func TestRuntimeMemoryLimit(t *testing.T) {
	for in, want := range map[string]int64{"": defaultMemoryLimit, "off": 0, "4GiB": 4 << 30, "768MiB": 768 << 20, "1024B": 1024, "64KiB": 64 << 10} {
		if got, err := (RuntimeConfig{MemoryLimit: in}).memoryLimit(); err != nil || got != want {
			t.Errorf("memoryLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	// The environment wins: with GOGC and GOMEMLIMIT set, apply changes
	// neither.
	before, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(-1)
	defer debug.SetGCPercent(before)
	defer debug.SetMemoryLimit(limit)
	RuntimeConfig{GCPercent: 250, MemoryLimit: "1GiB"}.apply(func(string) string { return "set" })
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GC percent %d after apply with GOGC set, want 100", got)
	}
	RuntimeConfig{GCPercent: 250, MemoryLimit: "1GiB"}.apply(func(string) string { return "" })
	if got := debug.SetGCPercent(100); got != 250 {
		t.Errorf("GC percent %d after apply, want 250", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 1<<30 {
		t.Errorf("memory limit %d after apply, want 1GiB", got)
	}
}

// A gateway whose identity cannot load does not start (fail closed).
func TestOpenRefusesBrokenIdentity(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"c.pem", "k.pem", "b.pem"} {
		os.WriteFile(filepath.Join(dir, f), []byte("not PEM"), 0o600)
	}
	m := NewMain()
	m.Stderr = io.Discard
	args := []string{"--trust-domain", "example.org", "--state-dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off",
		"--cert", filepath.Join(dir, "c.pem"), "--key", filepath.Join(dir, "k.pem"), "--bundle", filepath.Join(dir, "b.pem")}
	if err := m.ParseFlags(context.Background(), args); err != nil {
		t.Fatal(err)
	}
	err := m.Open(context.Background())
	m.Close()
	if err == nil || !strings.Contains(err.Error(), "identity") {
		t.Fatalf("Open = %v, want an identity error", err)
	}
}

// acmeJob registers target (nvmet, one port), the acme subsystem on it
// with one namespace, through the admin on adminAddr, and admits job-1 for
// acme's nodes 1 and 2 through the scheduler on schedAddr. It returns the
// subsystem's NQN.
func acmeJob(t *testing.T, dir, adminAddr, schedAddr, target string) string {
	t.Helper()
	sub := "nqn.2026-01.io.nvmegate.test:acme-train"
	inv := pb.NewInventoryClient(devConn(t, adminAddr, dir, "admin"))
	for _, err := range []error{
		func() error {
			_, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: target, Fabric: "fab", Region: "eu-west", Driver: "nvmet",
				Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}})
			return err
		}(),
		func() error {
			_, err := inv.AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: target, Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}})
			return err
		}(),
		func() error {
			_, err := inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: 1, Tenant: "acme", Region: "eu-west",
				DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}}})
			return err
		}(),
		func() error {
			_, err := pb.NewJobsClient(devConn(t, schedAddr, dir, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: "job-1", Tenant: "acme",
				Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1", "spiffe://nvmegate.test/node/acme-gpu-2"},
				Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
				AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(2 * time.Hour))})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return sub
}
