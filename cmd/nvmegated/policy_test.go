package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/internal/logbuf"
	"github.com/nvmegate/nvmegate/policy"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// copyDefaultPolicy writes the embedded policy into a directory.
func copyDefaultPolicy(t *testing.T, dir string) {
	t.Helper()
	if err := os.CopyFS(dir, policy.Default()); err != nil {
		t.Fatal(err)
	}
}

// A policy directory is hot-reloaded: a good change swaps in, a broken one
// is refused and logged while the old revision keeps answering. The test
// drives the reloader's check directly instead of waiting for its ticker.
func TestPolicyHotReload(t *testing.T) {
	policyDir := t.TempDir()
	copyDefaultPolicy(t, policyDir)
	dir := t.TempDir()
	logs := &logbuf.Buffer{}
	m := NewMain()
	m.Stderr = logs
	args := []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off", "--policy-dir", policyDir, "--policy-reload-interval", "1h"}
	if err := m.ParseFlags(context.Background(), args); err != nil {
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

	status := func() *pb.PolicyStatusResponse {
		t.Helper()
		st, err := pb.NewPolicyClient(devConn(t, m.GRPCAddr(), dir, "admin")).Status(ctxT(t), &pb.PolicyStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := status()
	if first.Source != policyDir {
		t.Fatalf("source = %q, want the directory", first.Source)
	}
	if m.reloader.check(ctx) {
		t.Fatal("an unchanged directory was reloaded")
	}

	// A good change: a new revision serves.
	rego := filepath.Join(policyDir, "authz.rego")
	src, err := os.ReadFile(rego)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rego, append(src, []byte("\n# reviewed "+time.Now().String()+"\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if !m.reloader.check(ctx) {
		t.Fatalf("a good change was not loaded; log:\n%s", logs)
	}
	second := status()
	if second.Revision == first.Revision {
		t.Fatal("revision did not change")
	}

	// A broken change: refused, logged once, the old revision keeps answering.
	if err := os.WriteFile(rego, []byte("package nvmegate.authz\n\ndecision := {"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m.reloader.check(ctx) || m.reloader.check(ctx) {
		t.Fatal("a broken policy was loaded")
	}
	if got := status(); got.Revision != second.Revision {
		t.Fatalf("serving revision changed to %s", got.Revision)
	}
	if n := strings.Count(logs.String(), "policy refused"); n != 1 {
		t.Fatalf("refusal logged %d times, want once; log:\n%s", n, logs)
	}
	// And the admin is still allowed, a node still refused: the old policy decides.
	if _, err := pb.NewInventoryClient(devConn(t, m.GRPCAddr(), dir, "admin")).ListTargets(ctxT(t), &pb.ListTargetsRequest{}); err != nil {
		t.Fatal(err)
	}

	// Every step is on the record, the new revision before it served.
	recs, _, err := m.audit.Query(ctx, audit.Filter{Kinds: []audit.EventKind{audit.EventPolicyLoad}}, audit.Page{})
	if err != nil {
		t.Fatal(err)
	}
	var details []string
	for _, r := range recs {
		details = append(details, r.Entry.Detail)
	}
	want := []string{"serving", ": loading", "serving", ": loading", "refused"}
	if len(details) != len(want) {
		t.Fatalf("policy_load entries:\n%s", strings.Join(details, "\n"))
	}
	for i, w := range want {
		if !strings.Contains(details[i], w) {
			t.Fatalf("entry %d %q, want %q", i, details[i], w)
		}
	}
	if !strings.Contains(details[1], second.Revision) {
		t.Fatalf("loading entry %q does not name revision %s", details[1], second.Revision)
	}

	// Without the audit log, a new policy is not loaded at all.
	if err := os.WriteFile(rego, append(src, []byte("\n# another review\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	m.audit.Close()
	if m.reloader.check(ctx) {
		t.Fatal("a policy was loaded that the audit log could not record")
	}
	if got := status(); got.Revision != second.Revision {
		t.Fatalf("serving revision changed to %s without an audit entry", got.Revision)
	}
}
