package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// gateway is a dev gateway process on dir.
type gateway struct {
	cmd *exec.Cmd
	log string
}

// startGateway starts `nvmegated dev` on dir (state kept across starts)
// and waits until it serves.
func startGateway(t *testing.T, bin, dir string, args ...string) *gateway {
	t.Helper()
	ready := filepath.Join(dir, "gateway.json")
	os.Remove(ready)
	log := filepath.Join(t.TempDir(), "gateway.log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(bin, "nvmegated"), append([]string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off"}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Read for the secret scan once the gateway is gone (cleanups run last
	// first: this one after the kill below).
	scanFiles(t, log, filepath.Join(dir, "state", "audit.db"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &gateway{cmd: cmd, log: log}
	t.Cleanup(func() { g.kill() })
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return g
		}
		if cmd.ProcessState != nil {
			break
		}
	}
	data, _ := os.ReadFile(log)
	t.Fatalf("the gateway did not become ready:\n%s", data)
	return nil
}

// kill stops the gateway with SIGKILL: no shutdown code runs.
func (g *gateway) kill() {
	if g.cmd.ProcessState == nil {
		g.cmd.Process.Kill()
		g.cmd.Wait()
	}
}

// cli runs the CLI as dev identity who. A run that hangs is killed after
// five minutes (and its error says so) rather than waited out by go test.
func cli(t testing.TB, bin, dir, who string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "nvmegate"), append([]string{"--dev-dir", dir, "--dev-identity", who}, args...)...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = fmt.Errorf("nvmegate %s: no answer in 5 minutes: %w", strings.Join(args, " "), err)
	}
	cliRuns.Add(1)
	scanQuoted(fmt.Sprintf("%s: nvmegate %s (run %d)", t.Name(), strings.Join(args, " "), cliRuns.Load()), out)
	return string(out), err
}

var cliRuns atomic.Int64

var ackedRE = regexp.MustCompile(`audit      all (\d+) acknowledged grants are in the log`)

// The load generator against real processes: sustained and storm runs
// report their figures, and every acknowledged grant is found in the log;
// a grant the log does not have is caught.
func TestBenchConnect(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "dev")
	startGateway(t, bin, dir)
	acks := filepath.Join(t.TempDir(), "acks")
	secrets := filepath.Join(t.TempDir(), "secrets")
	defer keepBenchSecrets(t, secrets)
	for _, args := range [][]string{
		{"--nodes", "30", "--concurrency", "8", "--duration", "2s", "--call", "trivial,health,connect"},
		{"--nodes", "100", "--call", "handshake,trivial,connect", "--storm"},
	} {
		out, err := cli(t, bin, dir, "admin", append([]string{"bench", "connect", "--acks", acks, "--secrets-out", secrets}, args...)...)
		if err != nil {
			t.Fatalf("bench connect %v: %v\n%s", args, err, out)
		}
		m := ackedRE.FindStringSubmatch(out)
		// Each call (the floors, then connect) reports its own figures,
		// and the connect a ratio to each floor.
		if m == nil || m[1] == "0" || strings.Count(out, "errors     0\n") != 3 || strings.Count(out, "p99.99") != 3 || strings.Count(out, "ratio ") != 2 ||
			!strings.Contains(out, " trivial ") {
			t.Fatalf("bench connect %v:\n%s", args, out)
		}
		if args[len(args)-1] == "--storm" && (m[1] != "100" || !strings.Contains(out, "handshakes 100 in")) {
			t.Fatalf("storm granted %s of 100 nodes:\n%s", m[1], out)
		}
	}
	// Open loop: calls start on a schedule, whatever the answers do; the
	// run ends after --requests of them.
	out, err := cli(t, bin, dir, "admin", "bench", "connect", "--acks", acks, "--nodes", "30", "--rate", "50", "--requests", "60", "--duration", "30s")
	if m := ackedRE.FindStringSubmatch(out); err != nil || m == nil || m[1] != "60" || !strings.Contains(out, "open loop at 50 calls/s") || !strings.Contains(out, "errors     0\n") {
		t.Fatalf("bench connect --rate: %v\n%s", err, out)
	}
	if out, err := cli(t, bin, dir, "admin", "bench", "verify", "--acks", acks); err != nil || !strings.Contains(out, "acknowledged grants are in the log") {
		t.Fatalf("bench verify: %v\n%s", err, out)
	}
	// A grant the log never saw is reported.
	f, err := os.OpenFile(acks, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(acks)
	job := strings.Fields(strings.SplitN(string(data), "\n", 2)[0])[1]
	fmt.Fprintf(f, "g-AAAAAAAAAAAAAAAAAAAAAA %s 1\n", job)
	f.Close()
	if out, err := cli(t, bin, dir, "admin", "bench", "verify", "--acks", acks); err == nil || !strings.Contains(out, "missing from the audit log") {
		t.Fatalf("bench verify with an invented grant: %v\n%s", err, out)
	}
}

// kill -9 the gateway 20 times under load: no acknowledged grant is
// missing from the log, the log verifies offline, the targets hold
// exactly the hosts of the active grants after the last restart, and the
// store equals a fresh replay of the log.
func TestKill9UnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "dev")
	acks := filepath.Join(t.TempDir(), "acks")
	secrets := filepath.Join(t.TempDir(), "secrets")
	defer keepBenchSecrets(t, secrets)
	rounds := 20
	if n, err := strconv.Atoi(os.Getenv("NVMEGATE_KILL_ROUNDS")); err == nil && n > 0 {
		rounds = n // the 50, for the figures in PERFORMANCE.md
	}
	var restarts []time.Duration
	for round := range rounds {
		start := time.Now()
		g := startGateway(t, bin, dir)
		restarts = append(restarts, time.Since(start))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		bench := exec.CommandContext(ctx, filepath.Join(bin, "nvmegate"), "--dev-dir", dir, "--dev-identity", "admin",
			"bench", "connect", "--nodes", "20", "--concurrency", "8", "--duration", "1500ms", "--acks", acks, "--timeout", "5s",
			"--secrets-out", secrets)
		var out strings.Builder
		bench.Stdout, bench.Stderr = &out, &out
		if err := bench.Start(); err != nil {
			t.Fatal(err)
		}
		// Kill while grants are being acknowledged: once the acks file
		// grows past what earlier rounds left, plus a little.
		before := fileSize(acks)
		for deadline := time.Now().Add(30 * time.Second); fileSize(acks) == before && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if fileSize(acks) == before {
			t.Fatalf("round %d: no grant acknowledged; bench:\n%s", round, out.String())
		}
		time.Sleep(time.Duration(round%5) * 40 * time.Millisecond)
		g.kill()
		bench.Wait() // it fails from here on: the gateway is gone
		cancel()
	}
	start := time.Now()
	last := startGateway(t, bin, dir)
	restarts = append(restarts, time.Since(start))
	slices.Sort(restarts)
	t.Logf("%d kills; restart until serving: median %s, max %s", rounds, restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond))
	if out, err := cli(t, bin, dir, "admin", "bench", "verify", "--acks", acks); err != nil {
		t.Fatalf("after %d kills: %v\n%s", rounds, err, out)
	} else {
		t.Log(strings.TrimSpace(out))
	}
	// The log verifies offline, with the public key alone.
	export := filepath.Join(t.TempDir(), "export")
	if out, err := cli(t, bin, dir, "auditor", "audit", "export", "--out", export); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if out, err := exec.Command(filepath.Join(bin, "nvmegate"), "audit", "verify", export, "--key", filepath.Join(export, "keys", "v1.pem")).CombinedOutput(); err != nil {
		t.Fatalf("the log does not verify after 20 kills: %v\n%s", err, out)
	}
	// The targets reconciled at start: each bench subsystem's tree allows
	// exactly the hosts of its active grants.
	out, err := cli(t, bin, dir, "admin", "-o", "json", "grants", "list", "--state", "active", "--page-size", "1000")
	if err != nil {
		t.Fatalf("grants list: %v\n%s", err, out)
	}
	var list struct {
		Grants []struct {
			HostNqn      string `json:"host_nqn"`
			SubsystemNqn string `json:"subsystem_nqn"`
		} `json:"grants"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("grants list: %v\n%s", err, out)
	}
	// A host once per subsystem: a kill between a connect's grant and its
	// superseding the node's earlier grant (a second commit, made once the
	// target took the new one) leaves both active, on one host entry,
	// until the node's next connect or the earlier one's expiry.
	want := map[string][]string{}
	for _, g := range list.Grants {
		if !slices.Contains(want[g.SubsystemNqn], g.HostNqn) {
			want[g.SubsystemNqn] = append(want[g.SubsystemNqn], g.HostNqn)
		}
	}
	trees, _ := filepath.Glob(filepath.Join(dir, "state", "configfs", "bench-*", "subsystems", "*"))
	if len(trees) != rounds {
		t.Fatalf("%d bench subsystem trees, want %d (one per round)", len(trees), rounds)
	}
	for _, sub := range trees {
		ents, _ := os.ReadDir(filepath.Join(sub, "allowed_hosts"))
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
		}
		w := want[filepath.Base(sub)]
		sort.Strings(got)
		sort.Strings(w)
		if strings.Join(got, ",") != strings.Join(w, ",") {
			t.Errorf("%s allows %v, active grants are for %v", filepath.Base(sub), got, w)
		}
	}
	// Replay is the truth: stopped, the store (brought up to the log, as
	// a restart does) has the state digest of a fresh replay of the log.
	last.kill()
	replayed, err := exec.Command(filepath.Join(bin, "nvmegated"), "replay", "--state-dir", filepath.Join(dir, "state")).CombinedOutput()
	if err != nil {
		t.Fatalf("replay after %d kills: %v\n%s", rounds, err, replayed)
	}
	t.Log(strings.TrimSpace(string(replayed)))
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// waitOrDump waits for cmd; if it has not exited within limit, it asks cmd
// and the gateway for their goroutine stacks (SIGQUIT), kills both and
// fails with what they printed — a hang is reported, not waited out.
func waitOrDump(t *testing.T, cmd *exec.Cmd, limit time.Duration, out fmt.Stringer, g *gateway) {
	t.Helper()
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(limit):
	}
	cmd.Process.Signal(syscall.SIGQUIT)
	g.cmd.Process.Signal(syscall.SIGQUIT)
	time.Sleep(2 * time.Second)
	cmd.Process.Kill()
	<-done
	g.kill()
	gw, _ := os.ReadFile(g.log)
	t.Fatalf("%s did not exit within %s.\n--- its output:\n%s\n--- gateway log:\n%s", filepath.Base(cmd.Path), limit, out, gw)
}

// keepBenchSecrets hands the secret scan a few of the secrets a bench
// received (each is searched in four forms through everything the run
// wrote: a few suffice to catch a leak of the kind, and keep the scan fast).
func keepBenchSecrets(t *testing.T, path string) {
	t.Helper()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 4 {
		lines = lines[:4]
	}
	if keepSecrets(t.Name()+": bench", []byte(strings.Join(lines, "\n"))) == 0 && !t.Failed() {
		t.Errorf("the bench wrote no secret to %s: the secret scan would not look for any", path)
	}
}
