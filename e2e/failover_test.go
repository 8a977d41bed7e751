package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/loadgen"
)

// Three gateway replicas on a 3-member etcd, under load spread over all
// three: the leader is killed with SIGKILL ten times and an etcd member
// once. Every acknowledged grant is in the one log at the index it was
// answered with (checked through every replica), the log verifies offline
// with the log's key, and each time another replica leads within the lease
// TTL.
func TestFailoverUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	needVault(t)
	bin, work, v, role, etcd := replicaStack(t)
	cl := etcd.client(t)
	ctx := context.Background()

	// The replicas: one dev trust domain (provisioned by the first), one
	// shared log signing key, the keys in Vault.
	dev := filepath.Join(work, "dev")
	keyDir := filepath.Join(work, "audit-keys")
	replicas := startReplicas(t, bin, work, dev, 3, replicaConfig{vault: v.Addr, role: role, keyDir: keyDir,
		endpoints: etcd.endpoints, extra: "  lease_ttl: 2\n", audit: "  checkpoint_interval: 200ms\n"})
	byName := map[string]*replicaProc{}
	for _, r := range replicas {
		byName[r.name] = r
	}
	leaderName := func() string {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		resp, err := cl.Get(cctx, "/nvmegate/leader/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil || len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	// Load on every replica: a fleet of nodes per replica, each node on
	// its own mTLS connection to that replica.
	type fleetRun struct {
		env   loadgen.Env
		fleet *loadgen.Fleet
		mu    sync.Mutex
		acks  []loadgen.Ack
		errs  map[string]int
	}
	var runs []*fleetRun
	envs, fleets := loadOn(t, dev, replicas, 36, 3, "failover")
	for i := range envs {
		runs = append(runs, &fleetRun{env: envs[i], fleet: fleets[i], errs: map[string]int{}})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, fr := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := loadgen.Options{Concurrency: 3, Duration: 500 * time.Millisecond, Requests: 30, RunID: fmt.Sprintf("failover%d", i)}
			for {
				select {
				case <-stop:
					return
				default:
				}
				r := loadgen.Run(ctx, fr.fleet, o)
				fr.mu.Lock()
				fr.acks = append(fr.acks, r.Acks...)
				for code, n := range r.Errors {
					fr.errs[code] += n
				}
				fr.mu.Unlock()
				if len(r.Acks) == 0 {
					time.Sleep(100 * time.Millisecond) // its replica is down: retry as a node would
				}
			}
		}()
	}
	acked := func() int {
		n := 0
		for _, fr := range runs {
			fr.mu.Lock()
			n += len(fr.acks)
			fr.mu.Unlock()
		}
		return n
	}

	// Ten leaders killed; an etcd member killed and brought back between.
	var failovers, nextGrants []time.Duration
	for k := range 10 {
		time.Sleep(time.Second)
		name := leaderName()
		victim := byName[name]
		if victim == nil {
			t.Fatalf("round %d: no leader in etcd (%q)", k, name)
		}
		before := acked()
		victim.kill9()
		killed := time.Now()
		var (
			newLeader         string
			failover, granted time.Duration
		)
		for deadline := killed.Add(20 * time.Second); newLeader == "" || granted == 0; time.Sleep(5 * time.Millisecond) {
			if granted == 0 && acked() > before {
				granted = time.Since(killed)
			}
			if newLeader == "" {
				if n := leaderName(); n != "" && n != name {
					newLeader, failover = n, time.Since(killed)
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: 20 s after %s was killed: new leader %q, a grant acknowledged since: %v", k, name, newLeader, granted > 0)
			}
		}
		failovers, nextGrants = append(failovers, failover), append(nextGrants, granted)
		t.Logf("round %d: killed leader %s; %s leads after %s; next grant after %s", k, name, newLeader,
			failovers[k].Round(time.Millisecond), nextGrants[k].Round(time.Millisecond))
		if k == 4 {
			m := etcd.members[1]
			m.proc.cmd.Process.Kill()
			m.proc.cmd.Wait()
			time.Sleep(2 * time.Second)
			etcd.start(t, m, "existing")
			t.Log("killed etcd member e1 and started it again")
		}
		victim.start(t, bin, dev)
	}

	// A leader paused (SIGSTOP) past its lease: another leads meanwhile;
	// resumed, it learns it no longer leads, and whatever its background
	// work tried on waking was refused by its term's fence in etcd.
	name := leaderName()
	paused := byName[name]
	if paused == nil {
		t.Fatalf("no leader in etcd before the pause (%q)", name)
	}
	mark := fileSize(paused.log)
	paused.cmd.Process.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	for deadline := stopped.Add(20 * time.Second); leaderName() == name; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			paused.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("%s paused, still the leader in etcd after 20 s", name)
		}
	}
	t.Logf("%s paused; %s leads after %s", name, leaderName(), time.Since(stopped).Round(time.Millisecond))
	time.Sleep(time.Second)
	paused.cmd.Process.Signal(syscall.SIGCONT)
	var woke string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		data, _ := os.ReadFile(paused.log)
		if int64(len(data)) > mark && strings.Contains(string(data[mark:]), "no longer leads the background work") {
			woke = string(data[mark:])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s resumed, but did not step down in 20 s:\n%s", name, data[mark:])
		}
	}
	if leaderName() == name {
		t.Fatalf("%s leads again right after it woke", name)
	}
	t.Logf("%s resumed and stepped down; its writes refused by the fence on waking: %d", name,
		strings.Count(woke, "not the leader any more")+strings.Count(woke, "no longer the leader"))

	close(stop)
	wg.Wait()

	// Every acknowledged grant, checked through every replica's copy.
	var all []loadgen.Ack
	for i, fr := range runs {
		all = append(all, fr.acks...)
		t.Logf("load on r%d: %d grants acknowledged, refusals by code %v", i, len(fr.acks), fr.errs)
	}
	if len(all) == 0 {
		t.Fatal("no grant was acknowledged")
	}
	for i, fr := range runs {
		var (
			missing []string
			err     error
		)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			missing, err = loadgen.Verify(ctx, fr.env, all)
			if err == nil && len(missing) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || len(missing) > 0 {
			t.Fatalf("through r%d: %d of %d acknowledged grants missing (%v), e.g. %v", i, len(missing), len(all), err, missing[:min(3, len(missing))])
		}
	}

	// The one log, read from etcd into a fresh copy, verifies offline
	// under the log's key.
	keys, err := attest.OpenKeyDir(keyDir, attest.Ed25519, false)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "export")
	if o, err := cli(t, bin, dev, "auditor", "--addr", replicas[0].addr, "audit", "export", "--out", out); err != nil {
		t.Fatalf("audit export: %v\n%s", err, o)
	}
	rep, err := audit.Verify(ctx, out, keys.PublicKeys(), nil, nil)
	if err != nil || len(rep.Failures) != 0 {
		t.Fatalf("the exported log: %+v %v", rep, err)
	}
	slices.Sort(failovers)
	slices.Sort(nextGrants)
	t.Logf("%d grants acknowledged across 10 leader kills and one etcd member kill; %d entries verify offline; "+
		"kill -9 of the leader → new leader: median %s, max %s (lease TTL 2 s); → next grant: median %s, max %s",
		len(all), rep.Entries, failovers[5].Round(time.Millisecond), failovers[9].Round(time.Millisecond),
		nextGrants[5].Round(time.Millisecond), nextGrants[9].Round(time.Millisecond))
}
