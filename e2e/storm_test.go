package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/loadgen"
)

// BenchmarkReplicaStorm measures a storm through three replicas: every
// node of one job connects at once, each on a new mTLS connection, the
// nodes spread over the replicas (node i on replica i%3) — against a
// storm of trivial calls (a health check on a bare gRPC server, each on a
// new connection) spread the same way over three floor servers, each a
// process of its own. Same nodes, same SVIDs, same machine, one run.
//
//	NVMEGATE_VAULT=$(scripts/build-vault.sh) go test -run '^$' -bench ReplicaStorm -benchtime 1x -timeout 30m ./e2e/
//
// NVMEGATE_STORM_NODES sets the job's nodes (default 10,000);
// NVMEGATE_BENCH_PPROF=dir saves CPU profiles of the connect storm.
func BenchmarkReplicaStorm(b *testing.B) {
	needVault(b)
	nodes := 10000
	if n, err := strconv.Atoi(os.Getenv("NVMEGATE_STORM_NODES")); err == nil && n > 0 {
		nodes = n
	}
	bin, work, v, role, etcd := replicaStack(b)
	dev := filepath.Join(work, "dev")
	replicas := startReplicas(b, bin, work, dev, 3, replicaConfig{vault: v.Addr, role: role, keyDir: filepath.Join(work, "audit-keys"),
		endpoints: etcd.endpoints, prefix: "/storm/"})
	envs, _ := loadOn(b, dev, replicas[:1], 3, 1, "storm-probe") // the clients of replica 0
	ctx := context.Background()
	fleet, err := loadgen.Setup(ctx, envs[0], loadgen.Options{Nodes: nodes, JobSize: nodes, Namespaces: 2, Concurrency: 1,
		Tenant: "acme", Region: "eu-west", RunID: "storm"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(fleet.Close)
	var gateways, floors []string
	for i, r := range replicas {
		gateways = append(gateways, r.addr)
		floors = append(floors, startFloor(b, bin, dev, filepath.Join(work, fmt.Sprintf("floor%d.log", i))))
	}
	if err := fleet.Spread(gateways, floors); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	const timeout, attempt = 5 * time.Minute, 60 * time.Second
	trivial := loadgen.Storm(ctx, fleet, loadgen.Options{Nodes: nodes, Call: loadgen.CallTrivial}, timeout, attempt)
	if dir := os.Getenv("NVMEGATE_BENCH_PPROF"); dir != "" {
		// CPU profiles of every replica and etcd member over the
		// storm's first 20 s (10 s from its fifth second).
		for _, r := range replicas {
			go profile(b, r.name, r.http, filepath.Join(dir, "storm-"+r.name+".pprof"), 20*time.Second)
		}
		for i, ep := range etcd.endpoints {
			go profile(b, fmt.Sprintf("etcd%d", i), strings.TrimPrefix(ep, "http://"), filepath.Join(dir, fmt.Sprintf("storm-etcd%d.pprof", i)), 20*time.Second)
		}
	}
	connect := loadgen.Storm(ctx, fleet, loadgen.Options{Nodes: nodes, Call: loadgen.CallConnect}, timeout, attempt)
	b.StopTimer()
	for _, r := range []*loadgen.Result{trivial, connect} {
		if r.ErrorCount() > 0 {
			b.Errorf("%s storm: %d attempts failed: %v %v", r.Call, r.ErrorCount(), r.Errors, r.FirstErrors)
		}
	}
	if connect.ErrorCount() > 0 {
		for _, r := range replicas {
			data, _ := os.ReadFile(r.log)
			// The first line of each kind (its msg), and how many.
			var kinds []string
			first, count := map[string]string{}, map[string]int{}
			for _, line := range strings.Split(string(data), "\n") {
				if !strings.Contains(line, "level=ERROR") {
					continue
				}
				_, msg, _ := strings.Cut(line, "msg=")
				msg, _, _ = strings.Cut(msg, " target=")
				if _, seen := first[msg]; !seen {
					kinds = append(kinds, msg)
					first[msg] = line
				}
				count[msg]++
			}
			var errs []string
			for _, k := range kinds {
				errs = append(errs, fmt.Sprintf("%d× %s", count[k], first[k]))
			}
			b.Logf("%s's errors, the first of each kind:\n%s", r.name, strings.Join(errs, "\n"))
		}
	}
	if len(connect.Acks) != nodes {
		b.Errorf("%d of %d nodes granted", len(connect.Acks), nodes)
	}
	var rss []string
	for _, r := range replicas {
		hwm := vmHWM(r)
		rss = append(rss, fmt.Sprintf("%s %d MiB", r.name, hwm>>20))
		b.ReportMetric(float64(hwm)/(1<<20), r.name+"-rss-MiB")
		if hwm > 1<<30 {
			b.Errorf("%s peaked at %d MiB (target ≤ 1 GiB per replica)", r.name, hwm>>20)
		}
	}
	b.Logf("storm of %d nodes over 3 replicas: %s; trivial storm over 3 floor servers %s; ratio %.2f×; peak RSS %s",
		nodes, connect.Elapsed.Round(time.Millisecond), trivial.Elapsed.Round(time.Millisecond),
		connect.Elapsed.Seconds()/trivial.Elapsed.Seconds(), strings.Join(rss, ", "))
	b.ReportMetric(connect.Elapsed.Seconds(), "storm-s")
	b.ReportMetric(trivial.Elapsed.Seconds(), "floor-storm-s")
	b.ReportMetric(connect.Elapsed.Seconds()/trivial.Elapsed.Seconds(), "x-floor")
}

// startFloor starts a floor server (nvmegate bench floor-server) as a
// process of its own and returns its address; it stops when the test
// ends (its standard input closes).
func startFloor(t testing.TB, bin, dev, logPath string) string {
	t.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, "nvmegate"), "--dev-dir", dev, "bench", "floor-server")
	cmd.Stderr = log
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
		log.Close()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("floor server: %q %v", line, err)
	}
	return addr
}

// vmHWM is the replica's peak resident set (VmHWM), in bytes; 0 if it
// cannot be read.
func vmHWM(r *replicaProc) int64 {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
