package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// Issue 29, defect 5, through the daemon: a namespace to encrypt at rest
// on a target whose agent has no cryptsetup is not exported and is counted
// in nvmegate_target_namespaces_not_served, and the target is programmed
// all the same: a connect is answered with its host on the target, and a
// release is answered with the host gone, nothing pending.
func TestNamespaceNotServedCountedTargetStillProgrammed(t *testing.T) {
	dir := t.TempDir()
	m, stop := startDaemon(t, dir, "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--remote-targets", "stor-eu-1")
	defer stop()
	inv := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin"))
	sub := "nqn.2026-01.io.nvmegate.test:acme-train"
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: "stor-eu-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}}))
	must(inv.AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: "stor-eu-1", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}}))
	for nsid, dev := range map[uint32]string{1: "", 2: "/dev/nvmegate-test0"} {
		must(inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: nsid, Tenant: "acme", Region: "eu-west",
			DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}, BackingDevice: dev}}))
	}
	must(pb.NewJobsClient(devConn(t, m.GRPCAddr(), dir, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: "job-1", Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}))

	// The target's agent, without cryptsetup (an nvmet driver with no
	// Crypt, as nvmegate-target --cryptsetup '').
	root := t.TempDir()
	applied := make(chan struct{}, 100)
	r := &targetagent.Remote{Conn: devConn(t, m.GRPCAddr(), dir, "target-stor-eu-1"), Driver: &nvmet.Driver{Root: root},
		Applied: func(uint64, error) { applied <- struct{}{} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	select {
	case <-applied:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent applied nothing")
	}

	node := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1"))
	c, err := node.Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatalf("connect on a target with a namespace it cannot serve: %v", err)
	}
	allowed := filepath.Join(root, "subsystems", sub, "allowed_hosts", c.Grant.HostNqn)
	if _, err := os.Lstat(allowed); err != nil {
		t.Fatalf("the granted host is not on the target: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "subsystems", sub, "namespaces", "2")); !os.IsNotExist(err) {
		t.Fatalf("the namespace to encrypt is exported without encryption: %v", err)
	}
	if metrics := httpGet(t, "http://"+m.HTTPAddr()+"/metrics", http.StatusOK); !strings.Contains(metrics, "nvmegate_target_namespaces_not_served 1") {
		t.Fatal("/metrics does not count the namespace not served")
	}
	if _, err := node.Release(ctxT(t), &pb.ReleaseRequest{GrantId: c.Grant.GrantId}); err != nil {
		t.Fatalf("release: %v", err)
	}
	if _, err := os.Lstat(allowed); !os.IsNotExist(err) {
		t.Fatalf("the released host is still on the target: %v", err)
	}
	if metrics := httpGet(t, "http://"+m.HTTPAddr()+"/metrics", http.StatusOK); !strings.Contains(metrics, "nvmegate_grants_removal_pending 0") {
		t.Fatal("a removal is pending")
	}
}
