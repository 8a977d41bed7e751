package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/internal/vaulttest"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The daemon with the vault key backend, set up the way an operator would:
// deploy/vault/setup.sh (mounts, the least-privilege policy, an AppRole)
// against a real Vault, then nvmegated logging in by AppRole. An admin
// rotates a root and a data key through the API; the roots live in Vault.
func TestDaemonVaultKeysSetUpByScript(t *testing.T) {
	v := vaulttest.Start(t)
	dir := t.TempDir()
	role := v.SetUpAppRole(t, filepath.Join(dir, "approle"))

	m := NewMain()
	m.Stderr = io.Discard
	if err := m.ParseFlags(context.Background(), []string{"dev", "--dir", filepath.Join(dir, "dev"), "--listen", "127.0.0.1:0", "--http-listen", "off"}); err != nil {
		t.Fatal(err)
	}
	m.Config.Keys.Backend = "vault"
	m.Config.Keys.Vault.Address = v.Addr
	m.Config.Keys.Vault.AppRole = &VaultAppRole{RoleID: role.RoleID, SecretIDFile: role.SecretIDFile}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return")
		}
		m.Close()
	}()

	conn := devConn(t, m.GRPCAddr(), filepath.Join(dir, "dev"), "admin")
	inv := pb.NewInventoryClient(conn)
	sub := "nqn.2026-01.io.nvmegate.test:vault-keys"
	steps := []func() error{
		func() error {
			_, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: "stor-1", Fabric: "fab", Region: "eu-west", Driver: "nvmet",
				Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}})
			return err
		},
		func() error {
			_, err := inv.AddSubsystem(ctxT(t), &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: "stor-1", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}})
			return err
		},
		func() error {
			_, err := inv.AddNamespace(ctxT(t), &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: 1, Tenant: "acme", Region: "eu-west",
				DataClass: "internal", Dataset: &pb.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("ab", 32)}}})
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	kc := pb.NewKeysClient(conn)
	for range 2 {
		if _, err := kc.Rotate(ctxT(t), &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: sub}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kc.Rotate(ctxT(t), &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: sub, Nsid: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := kc.Status(ctxT(t), &pb.KeysStatusRequest{SubsystemNqn: sub})
	if err != nil || len(st.Keys) != 2 || st.Keys[0].CurrentVersion != 2 || st.Keys[1].CurrentVersion != 2 {
		t.Fatalf("status %v %v", st, err)
	}
	// The roots are in Vault's KV, where the policy put them.
	list, err := v.Client.Logical().List("secret/metadata/nvmegate/roots")
	if err != nil || list == nil || len(list.Data["keys"].([]any)) != 1 {
		t.Fatalf("roots in Vault: %v %v", list, err)
	}
	keks := func() int {
		l, err := v.Client.Logical().List("nvmegate-kek/keys")
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			return 0
		}
		return len(l.Data["keys"].([]any))
	}
	if n := keks(); n != 1 {
		t.Fatalf("%d KEKs in Transit, want the namespace's", n)
	}

	// Crypto-erase, through the least-privilege policy: not a node's to
	// ask; the admin's removal with erase deletes the namespace's KEK in
	// Transit and records it; a second erase finds nothing.
	node := devConn(t, m.GRPCAddr(), filepath.Join(dir, "dev"), "acme-node-1")
	if _, err := pb.NewInventoryClient(node).RemoveNamespace(ctxT(t), &pb.RemoveNamespaceRequest{SubsystemNqn: sub, Nsid: 1, Erase: true}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node's erase: %v, want PermissionDenied", err)
	}
	if _, err := inv.RemoveNamespace(ctxT(t), &pb.RemoveNamespaceRequest{SubsystemNqn: sub, Nsid: 1, Erase: true}); err != nil {
		t.Fatalf("erase: %v", err)
	}
	if n := keks(); n != 0 {
		t.Fatalf("%d KEKs in Transit after the erase", n)
	}
	q, err := pb.NewAuditClient(conn).Query(ctxT(t), &pb.QueryRequest{SubsystemNqn: sub, Kinds: []string{"key_rotation"}})
	if err != nil {
		t.Fatal(err)
	}
	var before, after bool
	for _, e := range q.Entries {
		before = before || strings.Contains(string(e.Entry), "destroying it and its KEK (crypto-erase")
		after = after || strings.Contains(string(e.Entry), "destroyed with its KEK (crypto-erase")
	}
	if !before || !after {
		t.Fatalf("the erase is not in the log before and after (%v, %v): %d entries", before, after, len(q.Entries))
	}
	if _, err := inv.RemoveNamespace(ctxT(t), &pb.RemoveNamespaceRequest{SubsystemNqn: sub, Nsid: 1, Erase: true}); status.Code(err) != codes.NotFound {
		t.Fatalf("a second erase: %v, want NotFound", err)
	}
}
