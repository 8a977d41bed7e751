package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The daemon records the policy it starts with, every change and every
// refusal, and on shutdown signs a checkpoint that covers all of them; the
// log then verifies offline with the public keys of its key directory.
func TestDaemonAuditLog(t *testing.T) {
	m := auditStory(t, nil, nil)
	keys, err := attest.OpenKeyDir(m.Config.Audit.KeyDir, attest.Ed25519, false)
	if err != nil {
		t.Fatal(err)
	}
	checkAuditFile(t, m, keys.PublicKeys())
}

// With audit.vault set, a real Vault's Transit key signs the checkpoints;
// the log verifies offline with the public keys Vault lists.
func TestDaemonAuditLogVaultSigner(t *testing.T) {
	v := vaulttest.Start(t)
	ctx := context.Background()
	if err := v.Write(ctx, "transit/keys/nvmegate-audit", map[string]any{"type": "ed25519"}); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(v.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := auditStory(t, func(c *Config) {
		c.Audit.Vault = VaultSignerConfig{Address: v.Addr, TokenFile: tokenFile, Key: "nvmegate-audit"}
	}, nil)
	s, err := attest.NewVaultSigner(ctx, attest.VaultConfig{Address: v.Addr, Token: v.Token, Key: "nvmegate-audit"})
	if err != nil {
		t.Fatal(err)
	}
	checkAuditFile(t, m, s.PublicKeys())
	// The local key directory was not used.
	if _, err := os.Stat(m.Config.Audit.KeyDir); !os.IsNotExist(err) {
		t.Errorf("local key dir created with a Vault signer: %v", err)
	}
}

// auditStory runs the daemon (dev mode, config changed by edit), makes one
// change and one refused call, then runs during (if any), and stops it.
func auditStory(t *testing.T, edit func(*Config), during func(m *Main, dir string)) *Main {
	t.Helper()
	dir := t.TempDir()
	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off"}); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(&m.Config)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()

	target := &pb.Target{Id: "stor-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}
	if _, err := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin")).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: target}); err != nil {
		t.Fatal(err)
	}
	_, err := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "acme-node-1")).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: target})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node AddTarget: %v, want PermissionDenied", err)
	}
	if during != nil {
		during(m, dir)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkAuditFile checks the stopped daemon's log: the policy load, the
// change and the refusal, covered by the shutdown checkpoint, verifying
// offline under keys.
func checkAuditFile(t *testing.T, m *Main, keys []attest.PublicKey) {
	t.Helper()
	l, err := audit.Open(m.Config.Audit.Path, audit.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs, _, err := l.Query(context.Background(), audit.Filter{}, audit.Page{})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []audit.EventKind
	for _, r := range recs {
		kinds = append(kinds, r.Entry.Kind)
	}
	// The change's entry (recorded with the change: one gateway's store
	// is journaled in the log), then the refusal.
	want := []audit.EventKind{audit.EventPolicyLoad, audit.EventInventoryChange, audit.EventDeny}
	if !slices.Equal(kinds, want) {
		t.Fatalf("entries %v, want %v", kinds, want)
	}
	if recs[0].Entry.Caller != "spiffe://nvmegate.test/gateway/nvmegated" {
		t.Errorf("policy_load caller %q, want the gateway's own ID", recs[0].Entry.Caller)
	}
	cp, err := l.LatestCheckpoint()
	if err != nil || cp.Size != uint64(len(want)) {
		t.Fatalf("latest checkpoint size %d (%v), want %d: the shutdown checkpoint covers every entry", cp.Size, err, len(want))
	}
	rep, err := audit.CheckFile(context.Background(), m.Config.Audit.Path, keys, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Entries != uint64(len(want)) {
		t.Fatalf("offline check: %+v", rep)
	}
}

// A rotation through Keys.Rotate leaves two entries: the admin's request
// with its decision (before), and the gateway's record of the new version
// with its fingerprint (after). Neither holds key material.
func TestDaemonKeyRotationAudited(t *testing.T) {
	sub := "nqn.2026-01.io.nvmegate.test:acme-train"
	m := auditStory(t, nil, func(m *Main, dir string) {
		conn := devConn(t, m.GRPCAddr(), dir, "admin")
		if _, err := pb.NewInventoryClient(conn).AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{
			Nqn: sub, TargetId: "stor-1", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}}); err != nil {
			t.Fatal(err)
		}
		if _, err := pb.NewKeysClient(conn).Rotate(ctxT(t), &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: sub, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	})
	l, err := audit.Open(m.Config.Audit.Path, audit.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs, _, err := l.Query(context.Background(), audit.Filter{Kinds: []audit.EventKind{audit.EventKeyRotation}}, audit.Page{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d key_rotation entries, want 2", len(recs))
	}
	req, done := recs[0].Entry, recs[1].Entry
	if req.Caller != "spiffe://nvmegate.test/admin/ops" || req.Decision == nil || !req.Decision.Allow {
		t.Errorf("request entry: %+v", req)
	}
	// stor-1 is an nvmet target: its hosts' keys derive from the target's
	// root, which the rotation of any of its subsystems rotates.
	if done.Caller != "spiffe://nvmegate.test/gateway/nvmegated" || len(done.Keys) != 1 || done.Keys[0].Version != 1 ||
		done.Keys[0].Class != "access_root" || done.Keys[0].ID != "target:stor-1" || done.SubsystemNQN != "" || len(done.Keys[0].Fingerprint) < 20 {
		t.Errorf("rotation entry: %+v", done)
	}
}
