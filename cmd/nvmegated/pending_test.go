package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// A release while the target's agent is away is not answered as done: the
// grant is released but pending removal — in grants list and in the
// nvmegate_grants_removal_pending metric — and the daemon retries until
// the agent is back and removes the host; then nothing is pending.
func TestPendingRemovalRetriedUntilTheAgentReturns(t *testing.T) {
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
	must(inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: 1, Tenant: "acme", Region: "eu-west",
		DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}}}))
	must(pb.NewJobsClient(devConn(t, m.GRPCAddr(), dir, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: "job-1", Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}))

	// The target's agent, on its own tree; it can be stopped and started.
	root := t.TempDir()
	agentConn := devConn(t, m.GRPCAddr(), dir, "target-stor-eu-1")
	startAgent := func() func() {
		applied := make(chan struct{}, 100)
		r := &targetagent.Remote{Conn: agentConn, Driver: &nvmet.Driver{Root: root}, Applied: func(uint64, error) { applied <- struct{}{} }}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		select {
		case <-applied:
		case <-time.After(30 * time.Second):
			t.Fatal("the agent applied nothing")
		}
		return func() { cancel(); <-done }
	}
	stopAgent := startAgent()
	node := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1"))
	c, err := node.Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	allowed := filepath.Join(root, "subsystems", sub, "allowed_hosts", c.Grant.HostNqn)
	if _, err := os.Lstat(allowed); err != nil {
		t.Fatalf("the granted host is not on the target: %v", err)
	}

	stopAgent()
	_, err = node.Release(ctxT(t), &pb.ReleaseRequest{GrantId: c.Grant.GrantId})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "removal pending") {
		t.Fatalf("release with the agent away: %v, want Unavailable, removal pending", err)
	}
	if _, err := os.Lstat(allowed); err != nil {
		t.Fatal("the host left a target whose agent was away?")
	}
	list, err := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "admin")).ListGrants(ctxT(t), &pb.ListGrantsRequest{RemovalPending: true})
	if err != nil || len(list.Grants) != 1 || list.Grants[0].GrantId != c.Grant.GrantId || !list.Grants[0].RemovalPending ||
		list.Grants[0].State != pb.GrantState_GRANT_STATE_RELEASED {
		t.Fatalf("pending removals listed: %v %v", list, err)
	}
	if metrics := httpGet(t, "http://"+m.HTTPAddr()+"/metrics", http.StatusOK); !strings.Contains(metrics, "nvmegate_grants_removal_pending 1") {
		t.Fatalf("/metrics does not count the pending removal")
	}

	// The agent is back: the daemon's retry removes the host and settles.
	defer startAgent()()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(httpGet(t, "http://"+m.HTTPAddr()+"/metrics", http.StatusOK), "nvmegate_grants_removal_pending 0") {
		if time.Now().After(deadline) {
			t.Fatal("the pending removal was not settled after the agent returned")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := os.Lstat(allowed); !os.IsNotExist(err) {
		t.Fatalf("settled, but the host is still on the target: %v", err)
	}
	if _, err := node.Release(ctxT(t), &pb.ReleaseRequest{GrantId: c.Grant.GrantId}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a release of a grant released and removed: %v, want FailedPrecondition (no longer active)", err)
	}
}
