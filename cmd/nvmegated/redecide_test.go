package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/internal/logbuf"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The daemon keeps decisions true on its own: an inventory change (the
// job's namespace removed) revokes the grant on its subsystem through the
// store's change feed, and a policy revision hot-reloaded (us-west data no
// longer on us-west targets) revokes the grant made after, logging which
// grant and why.
func TestDaemonRedecidesAfterChanges(t *testing.T) {
	policyDir := t.TempDir()
	copyDefaultPolicy(t, policyDir)
	dir := t.TempDir()
	logs := &logbuf.Buffer{}
	m := NewMain()
	m.Stderr = logs
	if err := m.ParseFlags(context.Background(), []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off",
		"--policy-dir", policyDir, "--policy-reload-interval", "1h"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	inv := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin"))
	sub := "nqn.2026-01.io.nvmegate.test:acme-us"
	ns := &pb.Namespace{SubsystemNqn: sub, Nsid: 1, Tenant: "acme", Region: "us-west", DataClass: "internal",
		Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}}
	if _, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: "stor-us", Fabric: "fab", Region: "us-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: "stor-us", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(devConn(t, m.GRPCAddr(), dir, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: "job-1", Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"us-west"}, ExpiresAt: timestamppb.New(time.Now().Add(2 * time.Hour))}); err != nil {
		t.Fatal(err)
	}
	node := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1"))
	connect := func() string {
		t.Helper()
		c, err := node.Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
		if err != nil {
			t.Fatal(err)
		}
		return c.Grant.GrantId
	}
	revoked := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			g, err := m.db.Grant(ctxT(t), id)
			if err != nil {
				t.Fatal(err)
			}
			if g.State == nvmegate.GrantRevoked {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("grant %s still %s; log:\n%s", id, g.State, logs)
			}
		}
	}

	// An inventory change, through the feed.
	first := connect()
	if _, err := inv.RemoveNamespace(ctxT(t), &pb.RemoveNamespaceRequest{SubsystemNqn: sub, Nsid: 1}); err != nil {
		t.Fatal(err)
	}
	revoked(first)
	recs, _, err := m.audit.Query(ctx, audit.Filter{JobID: "job-1", Kinds: []audit.EventKind{audit.EventRevoke}}, audit.Page{})
	if err != nil || len(recs) != 1 || !strings.Contains(recs[0].Entry.Detail, "change of subsystem "+sub) {
		t.Fatalf("revoke entries %+v (%v)", recs, err)
	}

	// A policy revision, hot-reloaded.
	if _, err := inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	second := connect()
	data := filepath.Join(policyDir, "data.json")
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	tightened := strings.Replace(string(b), `"us-west":    {"target_regions": ["us-west", "us-east"]}`, `"us-west":    {"target_regions": ["us-east"]}`, 1)
	if tightened == string(b) {
		t.Fatal("policy data.json no longer has us-west's residency")
	}
	if err := os.WriteFile(data, []byte(tightened), 0o644); err != nil {
		t.Fatal(err)
	}
	if !m.reloader.check(ctx) {
		t.Fatalf("the tightened policy was not loaded; log:\n%s", logs)
	}
	revoked(second)
	if !strings.Contains(logs.String(), "grant revoked: no longer allowed") || !strings.Contains(logs.String(), second) {
		t.Fatalf("the revocation is not in the log:\n%s", logs)
	}
}
