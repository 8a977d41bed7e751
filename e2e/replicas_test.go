package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
	"github.com/nvmegate/nvmegate/loadgen"
)

// replicaProc is one nvmegated replica process on a fixed address.
type replicaProc struct {
	name, addr, cfg, state, log string
	http                        string // metrics and pprof (NVMEGATE_BENCH_PPROF), or "": off
	cmd                         *exec.Cmd
}

func (r *replicaProc) start(t testing.TB, bin, dev string) {
	t.Helper()
	ready := filepath.Join(r.state, "ready.json")
	os.Remove(ready)
	f, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	httpListen := "off"
	if r.http != "" {
		httpListen = r.http
	}
	r.cmd = exec.Command(filepath.Join(bin, "nvmegated"), "dev", "--dir", dev, "--config", r.cfg, "--listen", r.addr,
		"--http-listen", httpListen, "--state-dir", r.state, "--ready-file", ready)
	if r.http != "" {
		r.cmd.Args = append(r.cmd.Args, "--pprof")
	}
	r.cmd.Stdout, r.cmd.Stderr = f, f
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return
		}
	}
	data, _ := os.ReadFile(r.log)
	t.Fatalf("replica %s did not become ready:\n%s", r.name, data)
}

// kill9 kills the replica with SIGKILL: no shutdown code runs, its lease
// in etcd stays until its TTL.
func (r *replicaProc) kill9() {
	if r.cmd != nil && r.cmd.ProcessState == nil {
		r.cmd.Process.Kill()
		r.cmd.Wait()
	}
}

// etcdCluster is a cluster of real etcd server processes
// (internal/cmd/etcd, the etcd server's own main).
type etcdCluster struct {
	bin                string
	members            []*etcdMember
	endpoints, initial []string
}

type etcdMember struct {
	args []string
	proc *process
	log  string
}

// startEtcd builds the etcd server into bin and starts a cluster of n
// members on loopback, each with its data under work; it returns when a
// write succeeds.
func startEtcd(t testing.TB, bin, work string, n int) *etcdCluster {
	t.Helper()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "etcd"), "./internal/cmd/etcd")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build etcd: %v\n%s", err, out)
	}
	c := &etcdCluster{bin: bin}
	for i := range n {
		client, peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		c.endpoints = append(c.endpoints, client)
		c.initial = append(c.initial, fmt.Sprintf("e%d=%s", i, peer))
		c.members = append(c.members, &etcdMember{args: []string{"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(work, fmt.Sprintf("etcd%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
			"--initial-advertise-peer-urls", peer, "--initial-cluster-token", "e2e", "--log-level", "error",
			"--enable-pprof"}, // loopback only: the benchmark's profiles (NVMEGATE_BENCH_PPROF)
			log: filepath.Join(work, fmt.Sprintf("etcd%d.log", i))})
	}
	for _, m := range c.members {
		c.start(t, m, "new")
	}
	cl := c.client(t)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := cl.Put(ctx, "/probe", "1")
		cancel()
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster not up: %v", err)
		}
	}
}

// start starts member m; state is "new" for a new cluster, "existing" to
// bring a member back.
func (c *etcdCluster) start(t testing.TB, m *etcdMember, state string) {
	m.proc = startProcess(t, m.log, filepath.Join(c.bin, "etcd"), append(slices.Clone(m.args),
		"--initial-cluster", strings.Join(c.initial, ","), "--initial-cluster-state", state)...)
}

func (c *etcdCluster) client(t testing.TB) *clientv3.Client {
	t.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// replicaConfig is what the replicas' configuration files say.
type replicaConfig struct {
	vault     string
	role      vaulttest.AppRole
	keyDir    string   // the log's signing key, shared
	endpoints []string // etcd's; none: bbolt on this machine
	prefix    string   // in etcd; "" is the daemon's default
	extra     string   // more lines of the etcd section
	audit     string   // more lines of the audit section
	targets   string   // more lines of the targets section
}

// startReplicas starts n nvmegated replicas on one dev trust domain (dev,
// provisioned by the first) with their state under work.
func startReplicas(t testing.TB, bin, work, dev string, n int, c replicaConfig) []*replicaProc {
	t.Helper()
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	replicas := make([]*replicaProc, n)
	for i := range replicas {
		r := &replicaProc{name: fmt.Sprintf("r%d", i), addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			state: filepath.Join(work, fmt.Sprintf("r%d", i)), log: filepath.Join(work, fmt.Sprintf("r%d.log", i)),
			cfg: filepath.Join(work, fmt.Sprintf("r%d.yaml", i))}
		if os.Getenv("NVMEGATE_BENCH_PPROF") != "" {
			r.http = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		}
		cfg := fmt.Sprintf("keys:\n  backend: vault\n  vault:\n    address: %s\n    approle:\n      role_id: %s\n      secret_id_file: %s\n"+
			"audit:\n  key_dir: %s\n%stargets:\n  reconcile_interval: 1s\n%s", c.vault, c.role.RoleID, c.role.SecretIDFile, c.keyDir, c.audit, c.targets)
		if len(c.endpoints) > 0 {
			cfg += fmt.Sprintf("etcd:\n  endpoints: [%s]\n  name: %s\n%s", strings.Join(c.endpoints, ", "), r.name, c.extra)
			if c.prefix != "" {
				cfg += fmt.Sprintf("  prefix: %s\n", c.prefix)
			}
		}
		if err := os.WriteFile(r.cfg, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		replicas[i] = r
		r.start(t, bin, dev)
		t.Cleanup(r.kill9)
		scanFiles(t, r.log)
	}
	return replicas
}

// loadOn sets up a fleet of nodes on each replica (each node on its own
// mTLS connection to its replica), nodes in all.
func loadOn(t testing.TB, dev string, replicas []*replicaProc, nodes, conc int, run string) ([]loadgen.Env, []*loadgen.Fleet) {
	t.Helper()
	ctx := context.Background()
	ca, err := devca.Load(filepath.Join(dev, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		envs   []loadgen.Env
		fleets []*loadgen.Fleet
	)
	for i, r := range replicas {
		dial := func(who string) *grpc.ClientConn {
			conn, src, err := clientconn.Dial(ctx, clientconn.Options{DevDir: dev, DevIdentity: who, Addr: r.addr})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(); src.Close() })
			return conn
		}
		env := loadgen.Env{Addr: r.addr, Admin: dial("admin"), Scheduler: dial("acme-scheduler"), Auditor: dial("auditor"), CA: ca}
		per := nodes / len(replicas)
		o := loadgen.Options{Nodes: per, Namespaces: 2, Concurrency: conc, JobSize: min(per, 12), Tenant: "acme", Region: "eu-west",
			RunID: fmt.Sprintf("%s%d", run, i)}
		fleet, err := loadgen.Setup(ctx, env, o)
		if err != nil {
			data, _ := os.ReadFile(r.log)
			t.Fatalf("load on %s: %v\n%s's log:\n%s", r.name, err, r.name, data)
		}
		t.Cleanup(fleet.Close)
		envs, fleets = append(envs, env), append(fleets, fleet)
	}
	return envs, fleets
}

// replicaStack builds the binaries and starts what replicas stand on: a
// real Vault with the shipped AppRole set up, and a 3-member etcd cluster.
func replicaStack(t testing.TB) (bin, work string, v *vaulttest.Server, role vaulttest.AppRole, etcd *etcdCluster) {
	t.Helper()
	bin, work = buildBinaries(t), t.TempDir()
	v = vaulttest.Start(t)
	role = v.SetUpAppRole(t, filepath.Join(work, "approle"))
	keepSecret(t.Name()+": the AppRole secret ID", role.SecretID)
	keepSecret(t.Name()+": the Vault token", v.Token)
	return bin, work, v, role, startEtcd(t, bin, work, 3)
}

// BenchmarkReplicaConnects measures connects (grants acknowledged: policy,
// credentials, the target programmed, a durable audit entry) per second
// and their p99 through the gateway on bbolt (one machine), on etcd with
// one replica, and on etcd with three replicas with the load spread over
// them — in one run, with the same 3-member etcd cluster of real processes,
// the same Vault, the same nodes and connects in flight in all.
//
//	NVMEGATE_VAULT=$(scripts/build-vault.sh) go test -run '^$' -bench ReplicaConnects -benchtime 1x ./e2e/
//
// NVMEGATE_BENCH_VARIANTS=bbolt,etcd/replicas=3 runs those variants only;
// NVMEGATE_BENCH_INFLIGHT sets the connects in flight in all (default 24).
// NVMEGATE_BENCH_DURATION sets each variant's load (default 15s): with it
// long, the etcd variants show what etcd's database grows to under
// sustained load (its size is sampled each minute: the log is trimmed to
// its tail and etcd's history compacted behind it).
func BenchmarkReplicaConnects(b *testing.B) {
	needVault(b)
	const nodes = 240
	inFlight := 24 // in all: spread over the replicas
	if n, err := strconv.Atoi(os.Getenv("NVMEGATE_BENCH_INFLIGHT")); err == nil && n >= 3 {
		inFlight = n
	}
	duration := 15 * time.Second
	if d, err := time.ParseDuration(os.Getenv("NVMEGATE_BENCH_DURATION")); err == nil && d > 0 {
		duration = d
	}
	bin, work, v, role, etcd := replicaStack(b)
	run := 0 // -count runs a variant again in the same stack: names of its own
	for _, variant := range []struct {
		name     string
		replicas int
		etcd     bool
		extra    string // of the etcd section
	}{
		{"bbolt", 1, false, ""},
		{"etcd/replicas=1", 1, true, ""},
		{"etcd/replicas=1/no-group-wait", 1, true, "  log_group_wait: \"off\"\n"},
		{"etcd/replicas=2", 2, true, ""},
		{"etcd/replicas=3", 3, true, ""},
	} {
		if only := os.Getenv("NVMEGATE_BENCH_VARIANTS"); only != "" && !slices.Contains(strings.Split(only, ","), variant.name) {
			continue // the variants named there only (comma-separated), in this order
		}
		b.Run(variant.name, func(b *testing.B) {
			run++
			i := run
			dir := filepath.Join(work, fmt.Sprintf("v%d", i))
			c := replicaConfig{vault: v.Addr, role: role, keyDir: filepath.Join(dir, "audit-keys")}
			if variant.etcd {
				c.endpoints, c.prefix, c.extra = etcd.endpoints, fmt.Sprintf("/v%d/", i), variant.extra
			}
			replicas := startReplicas(b, bin, dir, filepath.Join(dir, "dev"), variant.replicas, c)
			defer func() {
				for _, r := range replicas {
					r.kill9()
				}
			}()
			_, fleets := loadOn(b, filepath.Join(dir, "dev"), replicas, nodes, inFlight/variant.replicas, fmt.Sprintf("bench%d-", i))
			ctx := context.Background()
			results := make([]*loadgen.Result, len(fleets))
			var wg sync.WaitGroup
			b.ResetTimer()
			if dir := os.Getenv("NVMEGATE_BENCH_PPROF"); dir != "" {
				// CPU profiles of every replica over the middle of the run.
				for _, r := range replicas {
					go profile(b, r.name, r.http, filepath.Join(dir, fmt.Sprintf("%s-%s.pprof", strings.ReplaceAll(variant.name, "/", "_"), r.name)), duration/2)
				}
				if variant.etcd {
					for i, ep := range etcd.endpoints {
						go profile(b, fmt.Sprintf("etcd%d", i), strings.TrimPrefix(ep, "http://"), filepath.Join(dir, fmt.Sprintf("%s-etcd%d.pprof", strings.ReplaceAll(variant.name, "/", "_"), i)), duration/2)
					}
				}
			}
			var sizes *etcdSizes
			if variant.etcd {
				sizes = sampleEtcdSize(b, etcd, min(time.Minute, duration/4))
			}
			// CPU of each kind of process over the middle half of the load.
			var gwPIDs, etcdPIDs []int
			for _, r := range replicas {
				gwPIDs = append(gwPIDs, r.cmd.Process.Pid)
			}
			if variant.etcd {
				for _, m := range etcd.members {
					etcdPIDs = append(etcdPIDs, m.proc.cmd.Process.Pid)
				}
			}
			cpu := make(chan [3]float64, 1) // cores: gateways, etcd, this process (the load generator)
			go func() {
				time.Sleep(duration / 4)
				g0, e0, s0 := cpuSeconds(gwPIDs...), cpuSeconds(etcdPIDs...), cpuSeconds(os.Getpid())
				time.Sleep(duration / 2)
				g1, e1, s1 := cpuSeconds(gwPIDs...), cpuSeconds(etcdPIDs...), cpuSeconds(os.Getpid())
				w := (duration / 2).Seconds()
				cpu <- [3]float64{(g1 - g0) / w, (e1 - e0) / w, (s1 - s0) / w}
			}()
			for j, f := range fleets {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[j] = loadgen.Run(ctx, f, loadgen.Options{Concurrency: inFlight / variant.replicas, Duration: duration, RunID: fmt.Sprintf("bench%d-%d", i, j)})
				}()
			}
			wg.Wait()
			b.StopTimer()
			if sizes != nil {
				maxSize, maxInUse := sizes.stop()
				b.ReportMetric(float64(maxSize)/(1<<20), "etcd-db-MiB-max")
				b.ReportMetric(float64(maxInUse)/(1<<20), "etcd-inuse-MiB-max")
			}
			var (
				lat     []time.Duration
				elapsed time.Duration
				errs    int
			)
			for _, r := range results {
				lat = append(lat, r.Latencies...)
				elapsed = max(elapsed, r.Elapsed)
				errs += r.ErrorCount()
				if r.ErrorCount() > 0 {
					b.Errorf("refused connects: %v %v", r.Errors, r.FirstErrors)
				}
			}
			slices.Sort(lat)
			if len(lat) == 0 {
				b.Fatal("no connect acknowledged")
			}
			rate := float64(len(lat)) / elapsed.Seconds()
			b.ReportMetric(rate, "grants/s")
			cores := <-cpu
			b.ReportMetric(cores[0]/rate*1000, "gw-cpu-ms/grant")
			b.ReportMetric(cores[1]/rate*1000, "etcd-cpu-ms/grant")
			b.ReportMetric((cores[0]+cores[1]+cores[2])/rate*1000, "box-cpu-ms/grant")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(errs), "errors")
		})
	}
}

// cpuSeconds is the CPU time (user and system) the processes pids have
// used, read from /proc/PID/stat; a process gone counts nothing.
func cpuSeconds(pids ...int) float64 {
	const ticks = 100 // USER_HZ on Linux
	var total float64
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and
		// may hold spaces: utime and stime are the 12th and 13th.
		_, rest, ok := strings.Cut(string(data), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		s, _ := strconv.ParseFloat(f[12], 64)
		total += (u + s) / ticks
	}
	return total
}

// etcdSizes samples the database size of every etcd member while a
// variant runs.
type etcdSizes struct {
	stopc           chan struct{}
	done            chan struct{}
	maxSize, maxUse int64
}

// sampleEtcdSize starts sampling each member's database (its file, and
// the part in use) every period, logging each sample.
func sampleEtcdSize(b *testing.B, c *etcdCluster, period time.Duration) *etcdSizes {
	cl := c.client(b)
	s := &etcdSizes{stopc: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	sample := func() {
		for _, ep := range c.endpoints {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := cl.Status(ctx, ep)
			cancel()
			if err != nil {
				continue
			}
			s.maxSize, s.maxUse = max(s.maxSize, st.DbSize), max(s.maxUse, st.DbSizeInUse)
			// On stderr as it comes too: a benchmark's log shows at its end.
			line := fmt.Sprintf("etcd %s at %s: db %.1f MiB, in use %.1f MiB", ep, time.Since(start).Round(time.Second), float64(st.DbSize)/(1<<20), float64(st.DbSizeInUse)/(1<<20))
			b.Log(line)
			fmt.Fprintln(os.Stderr, line)
		}
	}
	go func() {
		defer close(s.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-s.stopc:
				sample()
				return
			case <-t.C:
				sample()
			}
		}
	}()
	return s
}

// stop ends the sampling (after one last sample) and returns the largest
// database and the largest part in use seen.
func (s *etcdSizes) stop() (int64, int64) {
	close(s.stopc)
	<-s.done
	return s.maxSize, s.maxUse
}

// profile saves a CPU profile of the process named name serving pprof at
// addr (a replica's --pprof, an etcd member's --enable-pprof) of length
// d, taken from a quarter into the run (NVMEGATE_BENCH_PPROF=dir).
func profile(b *testing.B, name, addr, path string, d time.Duration) {
	time.Sleep(d / 2)
	if g, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/goroutine?debug=1", addr)); err == nil {
		data, _ := io.ReadAll(g.Body)
		g.Body.Close()
		_ = os.WriteFile(strings.TrimSuffix(path, ".pprof")+".goroutines.txt", data, 0o600)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
	if err != nil {
		b.Logf("profile of %s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(path, data, 0o600)
	}
	if err != nil {
		b.Logf("profile of %s: %v", name, err)
	}
}

// electedName is the replica name in the leader's election value: the
// name and the peer address the others forward their writes to.
func electedName(v []byte) string {
	var c struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(v, &c) != nil || c.Name == "" {
		return string(v)
	}
	return c.Name
}
