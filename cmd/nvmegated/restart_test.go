package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// startDaemon runs the dev daemon in dir, serving gRPC on listen, until
// the returned stop is called.
func startDaemon(t *testing.T, dir, listen string, flags ...string) (*Main, func()) {
	t.Helper()
	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), append([]string{"dev", "--dir", dir, "--listen", listen, "--http-listen", "off"}, flags...)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	return m, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

func allowedHosts(t *testing.T, m *Main, sub string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(m.Config.Targets.NVMetRoot, "stor-1", "subsystems", sub, "allowed_hosts"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A gateway restarted while grants are active converges the target to
// exactly those grants: the tree is rebuilt from the store even if the
// target lost it, with the granted keys.
func TestRestartReconcilesGrants(t *testing.T) {
	dir := t.TempDir()
	m, stop := startDaemon(t, dir, "127.0.0.1:0")
	sub := acmeJob(t, dir, m.GRPCAddr(), m.GRPCAddr(), "stor-1")
	var grants []*pb.Grant
	for _, n := range []string{"acme-node-1", "acme-node-2"} {
		c, err := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, n)).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, c.Grant)
	}
	if hs := allowedHosts(t, m, sub); len(hs) != 2 {
		t.Fatalf("hosts before restart: %v", hs)
	}
	root := m.Config.Targets.NVMetRoot
	stop()

	// While the gateway is down the target loses its tree (a reboot of the
	// storage server clears configfs).
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	m, stop = startDaemon(t, dir, "127.0.0.1:0")
	defer stop()
	hs := allowedHosts(t, m, sub)
	if len(hs) != 2 || !contains(hs, grants[0].HostNqn) || !contains(hs, grants[1].HostNqn) {
		t.Fatalf("hosts after restart: %v, want the two granted", hs)
	}
	// The keys on the target are the granted ones (same root version).
	key, err := os.ReadFile(filepath.Join(root, "stor-1", "hosts", grants[0].HostNqn, "dhchap_key"))
	if err != nil || !strings.HasPrefix(string(key), "DHHC-1:") {
		t.Fatalf("key after restart: %v", err)
	}
	// A release after the restart removes the host.
	if _, err := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1")).Release(ctxT(t), &pb.ReleaseRequest{GrantId: grants[0].GrantId}); err != nil {
		t.Fatal(err)
	}
	if hs := allowedHosts(t, m, sub); len(hs) != 1 || hs[0] != grants[1].HostNqn {
		t.Fatalf("hosts after release: %v", hs)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// A remote target agent rides out a gateway restart: its stream ends, it
// reconnects with backoff to the gateway on the same address, and applies
// the state it streams again.
func TestRemoteAgentSurvivesGatewayRestart(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	// The target is programmed by its own agent (a target the gateway
	// programs itself takes none).
	start := func() (*Main, func()) { return startDaemon(t, dir, addr, "--remote-targets", "stor-eu-1") }
	m, stop := start()
	if _, err := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin")).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{
		Id: "stor-eu-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}}); err != nil {
		t.Fatal(err)
	}
	applied := make(chan uint64, 100)
	gw := spiffeid.RequireFromString("spiffe://nvmegate.test/gateway/nvmegated")
	cert, key := devca.SVIDPaths(dir, "target-stor-eu-1")
	src, err := identity.NewFileSource(cert, key, devca.BundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(identity.ClientCredentials(src, tlsconfig.AuthorizeID(gw))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := &targetagent.Remote{Conn: conn, Driver: &nvmet.Driver{Root: t.TempDir()}, Applied: func(gen uint64, err error) {
		if err == nil {
			applied <- gen
		}
	}}
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan struct{})
	go func() { r.Run(rctx); close(rdone) }()
	defer func() { rcancel(); <-rdone }()
	wait := func(what string) {
		t.Helper()
		select {
		case <-applied:
		case <-time.After(30 * time.Second):
			t.Fatalf("no state applied %s", what)
		}
	}
	wait("at first")
	stop()
	m, stop = start()
	defer stop()
	wait("after the gateway restarted")
}

// A target listed as remote is programmed by its own agent only: without
// it connected, Connect fails and no local tree stands in for it.
func TestRemoteTargetWithoutAgentFailsClosed(t *testing.T) {
	dir := t.TempDir()
	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off", "--remote-targets", "stor-1"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done; m.Close() }()
	inv := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin"))
	sub := "nqn.2026-01.io.nvmegate.test:acme-train"
	if _, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: "stor-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: "stor-1", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: 1, Tenant: "acme", Region: "eu-west",
		DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(devConn(t, m.GRPCAddr(), dir, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: "job-1", Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	_, err := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("connect with the agent away: %v, want Unavailable", err)
	}
	if _, err := os.Stat(filepath.Join(m.Config.Targets.NVMetRoot, "stor-1", "hosts")); !os.IsNotExist(err) {
		t.Fatalf("a local tree stood in for the remote target: %v", err)
	}
}
