package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/nodeagent"
)

func TestStatusTable(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	st := nodeagent.Status{Job: "job-1", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000", Started: now.Add(-time.Hour),
		Subsystems: []nodeagent.SubsystemStatus{
			{Subsystem: "nqn.2026-01.io.example:a", Grant: "g-1", KeyVersion: 3, Expires: now.Add(50 * time.Minute), Controller: "nvme0",
				State: "live", TLS: true, LastRenewal: now.Add(-2 * time.Second), Rekeys: 1},
			{Subsystem: "nqn.2026-01.io.example:b", Error: "connect: refused"},
		}}
	var b bytes.Buffer
	if err := printStatus(&b, st, now); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"job job-1", "g-1", "v3", "nvme0", "live", "50m0s", "2s ago", "connect: refused", "2026-12-04T11:00:00Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// A second agent on the same status socket is refused; the socket goes
// with its agent.
func TestStatusSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "node.sock")
	a := &nodeagent.Agent{Job: "job-1"}
	log := slog.New(slog.DiscardHandler)
	stop, err := serveStatus(sock, a, log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("status socket: %v, %v", fi, err)
	}
	if _, err := serveStatus(sock, a, log); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("a second agent on the socket: %v", err)
	}
	st, _, err := fetchStatus(context.Background(), sock)
	if err != nil || st.Job != "job-1" {
		t.Fatalf("fetchStatus = %+v, %v", st, err)
	}
	stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left after stop: %v", err)
	}
	if _, _, err := fetchStatus(context.Background(), sock); err == nil || !strings.Contains(err.Error(), "no agent answers") {
		t.Fatalf("status with no agent: %v", err)
	}
}

func TestFlags(t *testing.T) {
	for args, want := range map[string]string{
		"run":                               `required flag(s) "job"`,
		"run --job j --renew-every -1s":     "must not be negative",
		"status -o yaml":                    "-o must be table or json",
		"run --job j --dev-dir d":           "--dev-dir and --dev-identity go together",
		"status --status-socket /nonexist/": "no agent answers",
	} {
		var out, errOut bytes.Buffer
		root := newRoot(&out, &errOut)
		root.SetArgs(strings.Fields(args))
		err := root.ExecuteContext(context.Background())
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", args, err, want)
		}
	}
}
