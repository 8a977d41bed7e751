package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/loadgen"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Three gateway replicas on a 3-member etcd, under load spread over all
// three: the leader is killed with SIGKILL ten times and an etcd member
// once. Every acknowledged grant is in the one log at the index it was
// answered with (checked through every replica), the log verifies offline
// with the log's key, each time another replica leads within the lease
// TTL and sweeps at once (its log says so), and a target whose agent
// follows the replicas holds exactly the active grants' hosts.
func TestFailoverUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	needVault(t)
	ttl := 2 // the lease's TTL in seconds; NVMEGATE_FAILOVER_TTL=10 for the default's figures
	if n, err := strconv.Atoi(os.Getenv("NVMEGATE_FAILOVER_TTL")); err == nil && n > 0 {
		ttl = n
	}
	bin, work, v, role, etcd := replicaStack(t)
	cl := etcd.client(t)
	ctx := context.Background()

	// The replicas: one dev trust domain (provisioned by the first), one
	// shared log signing key, the keys in Vault.
	dev := filepath.Join(work, "dev")
	keyDir := filepath.Join(work, "audit-keys")
	// The first fleet's target is programmed by its own agent (a process,
	// following the replicas), the others by the replicas' embedded driver.
	const agentTarget, agentSub = "bench-failover0", "nqn.2026-01.io.nvmegate.bench:failover0"
	replicas := startReplicas(t, bin, work, dev, 3, replicaConfig{vault: v.Addr, role: role, keyDir: keyDir,
		endpoints: etcd.endpoints, extra: fmt.Sprintf("  lease_ttl: %d\n", ttl), audit: "  checkpoint_interval: 200ms\n",
		targets: "  remote: [" + agentTarget + "]\n"})
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
		return electedName(resp.Kvs[0].Value)
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
	tree := startTargetAgent(t, bin, work, dev, agentTarget, replicas)
	waitForFile(t, filepath.Join(tree, "subsystems", agentSub), "the target agent's first state")
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
	var failovers, nextGrants, sweeps, resumes []time.Duration
	kills := 10
	if n, err := strconv.Atoi(os.Getenv("NVMEGATE_FAILOVER_ROUNDS")); err == nil && n >= 10 {
		kills = n // the figures: NVMEGATE_FAILOVER_ROUNDS=30
	}
	for k := range kills {
		time.Sleep(time.Second)
		name := leaderName()
		victim := byName[name]
		if victim == nil {
			t.Fatalf("round %d: no leader in etcd (%q)", k, name)
		}
		before := acked()
		marks := map[string]int64{}
		for n, r := range byName {
			marks[n] = fileSize(r.log)
		}
		victim.kill9()
		killed := time.Now()
		var (
			newLeader                         string
			failover, granted, swept, resumed time.Duration
			atLeader                          int // grants acknowledged when the new leader was seen
		)
		// granted: the first grant acknowledged after the kill (one the
		// old leader had sequenced, answered late, counts); resumed: the
		// first after the new leader was seen — writes pause while
		// leadership moves.
		for deadline := killed.Add(20 * time.Second); newLeader == "" || granted == 0 || swept == 0 || resumed == 0; time.Sleep(5 * time.Millisecond) {
			if granted == 0 && acked() > before {
				granted = time.Since(killed)
			}
			if newLeader == "" {
				if n := leaderName(); n != "" && n != name {
					newLeader, failover, atLeader = n, time.Since(killed), acked()
				}
			} else if resumed == 0 && acked() > atLeader {
				resumed = time.Since(killed)
			}
			if newLeader != "" && swept == 0 && logHas(byName[newLeader].log, marks[newLeader], "swept at the start of this replica's term") {
				swept = time.Since(killed)
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: 20 s after %s was killed: new leader %q, swept: %v, a grant acknowledged since: %v", k, name, newLeader, swept > 0, granted > 0)
			}
		}
		failovers, nextGrants, sweeps, resumes = append(failovers, failover), append(nextGrants, granted), append(sweeps, swept), append(resumes, resumed)
		t.Logf("round %d: killed leader %s; %s leads after %s and has swept after %s; next grant after %s; writes resumed after %s", k, name, newLeader,
			failovers[k].Round(time.Millisecond), swept.Round(time.Millisecond), nextGrants[k].Round(time.Millisecond), resumed.Round(time.Millisecond))
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

	// A graceful handoff: the leader stopped with SIGTERM resigns its
	// election key, and another leads without waiting out the lease.
	name = leaderName()
	leaving := byName[name]
	if leaving == nil {
		t.Fatalf("no leader in etcd before the handoff (%q)", name)
	}
	before := acked()
	leaving.cmd.Process.Signal(syscall.SIGTERM)
	termed := time.Now()
	var handoff, handoffGrant time.Duration
	for deadline := termed.Add(20 * time.Second); handoff == 0 || handoffGrant == 0; time.Sleep(2 * time.Millisecond) {
		if n := leaderName(); handoff == 0 && n != "" && n != name {
			handoff = time.Since(termed)
		}
		if handoffGrant == 0 && acked() > before {
			handoffGrant = time.Since(termed)
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after %s was stopped: new leader %v, a grant since %v", name, handoff > 0, handoffGrant > 0)
		}
	}
	leaving.cmd.Wait()
	t.Logf("graceful handoff: %s stopped (SIGTERM); %s leads after %s; next grant after %s", name, leaderName(),
		handoff.Round(time.Millisecond), handoffGrant.Round(time.Millisecond))
	if handoff > 2*time.Second {
		t.Errorf("a graceful handoff took %s: the leader did not resign its election key", handoff)
	}
	leaving.start(t, bin, dev)

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

	// The agent's target holds exactly the hosts of the active grants on
	// it: none lost or gained across the kills (its replica among them).
	hostsMatch(t, envs[0].Admin, tree, agentSub)

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
	// Through any replica, the same log: an export of the same size
	// verifies offline to the same root.
	for _, r := range replicas[1:] {
		o := filepath.Join(work, "export-"+r.name)
		if b, err := cli(t, bin, dev, "auditor", "--addr", r.addr, "audit", "export", "--out", o, "--tree-size", strconv.FormatUint(rep.TreeSize, 10)); err != nil {
			t.Fatalf("audit export through %s: %v\n%s", r.name, err, b)
		}
		other, err := audit.Verify(ctx, o, keys.PublicKeys(), nil, nil)
		if err != nil || len(other.Failures) != 0 {
			t.Fatalf("the log exported through %s: %+v %v", r.name, other, err)
		}
		if other.TreeSize != rep.TreeSize || other.RootHash != rep.RootHash {
			t.Fatalf("through %s the log of %d entries has root %s; through %s, %d entries, %s", r.name, other.TreeSize, other.RootHash,
				replicas[0].name, rep.TreeSize, rep.RootHash)
		}
	}
	// No grant is recorded twice: a forwarded write retried across a
	// leader's death (its answer lost) is not sequenced again.
	recs, err := audit.ExportRecords(out, uint64(rep.Entries))
	if err != nil {
		t.Fatal(err)
	}
	granted := map[string]int{}
	for _, r := range recs {
		if r.Entry.Kind == audit.EventGrant && r.Entry.GrantID != "" {
			granted[r.Entry.GrantID]++
		}
	}
	dups := 0
	for id, n := range granted {
		if n > 1 {
			dups++
			t.Errorf("grant %s recorded %d times", id, n)
		}
	}
	t.Logf("%d grants recorded in the log, %d of them more than once", len(granted), dups)

	// Replay is the truth on every replica. All killed at once (no write
	// after: the load stopped, and each passed the read barrier above),
	// each one's store, brought up to its copy as a restart does, has the
	// state digest of a fresh replay of that copy (`nvmegated replay`
	// fails otherwise); and copies that end at the same revision hold the
	// same state.
	for _, r := range replicas {
		r.kill9()
	}
	atRev := map[uint64]map[string][]string{} // revision → digest → replicas
	for _, r := range replicas {
		out, err := exec.Command(filepath.Join(bin, "nvmegated"), "replay", "--state-dir", r.state).CombinedOutput()
		if err != nil {
			t.Fatalf("replay of %s after the failovers: %v\n%s", r.name, err, out)
		}
		var rev uint64
		var digest string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "replay" && f[1] == "revision" {
				rev, _ = strconv.ParseUint(f[2], 10, 64)
				digest = f[3]
			}
		}
		if digest == "" {
			t.Fatalf("replay of %s printed no digest:\n%s", r.name, out)
		}
		if atRev[rev] == nil {
			atRev[rev] = map[string][]string{}
		}
		atRev[rev][digest] = append(atRev[rev][digest], r.name)
	}
	shared := false
	for rev, byDigest := range atRev {
		if len(byDigest) > 1 {
			t.Errorf("at revision %d the replicas' states differ: %v", rev, byDigest)
		}
		for digest, names := range byDigest {
			t.Logf("revision %d, %s: %v (each store equal to a fresh replay of its copy)", rev, digest, names)
			shared = shared || len(names) > 1
		}
	}
	if !shared {
		t.Errorf("no two replicas' copies end at the same revision (%d revisions): nothing to compare", len(atRev))
	}
	slices.Sort(failovers)
	slices.Sort(nextGrants)
	slices.Sort(sweeps)
	slices.Sort(resumes)
	t.Logf("writes resumed after the kill: median %s, max %s (lease TTL %d s)", resumes[len(resumes)/2].Round(time.Millisecond),
		resumes[len(resumes)-1].Round(time.Millisecond), ttl)
	t.Logf("%d grants acknowledged across %d leader kills and one etcd member kill; %d entries verify offline; "+
		"kill -9 of the leader → new leader: median %s, max %s (lease TTL %d s); → its first sweep: median %s, max %s; → next grant: median %s, max %s",
		len(all), kills, rep.Entries, failovers[len(failovers)/2].Round(time.Millisecond), failovers[len(failovers)-1].Round(time.Millisecond), ttl,
		sweeps[len(sweeps)/2].Round(time.Millisecond), sweeps[len(sweeps)-1].Round(time.Millisecond),
		nextGrants[len(nextGrants)/2].Round(time.Millisecond), nextGrants[len(nextGrants)-1].Round(time.Millisecond))
}

// logHas says whether the file at path holds s past offset from.
func logHas(path string, from int64, s string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, from, 1<<40))
	return err == nil && strings.Contains(string(data), s)
}

// startTargetAgent runs nvmegate-target as target id, with an SVID of the
// dev trust domain, on an nvmet tree in a directory (not configfs: the
// driver writes the same files), dialing the replicas' addresses in turn;
// it returns the tree.
func startTargetAgent(t *testing.T, bin, work, dev, id string, replicas []*replicaProc) string {
	t.Helper()
	ca, err := devca.Load(filepath.Join(dev, "ca"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	svid, err := ca.Issue(spiffeid.RequireFromPath(ca.TrustDomain(), "/target/"+id), now.Add(-time.Minute), now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, tree := filepath.Join(work, id+".pem"), filepath.Join(work, id+".key"), filepath.Join(work, id+"-nvmet")
	for path, data := range map[string][]byte{cert: certPEM, key: keyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(tree, 0o700); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, r := range replicas {
		addrs = append(addrs, r.addr)
	}
	startProcess(t, filepath.Join(work, id+".log"), filepath.Join(bin, "nvmegate-target"),
		"--cert", cert, "--key", key, "--bundle", devca.BundlePath(dev), "--addr", strings.Join(addrs, ","),
		"--nvmet-root", tree, "--cryptsetup", "", "--reencrypt-dir", "")
	return tree
}

func waitForFile(t *testing.T, path, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 30 s (%s)", what, path)
		}
	}
}

// hostsMatch waits until the hosts allowed on subsystem sub in the nvmet
// tree are those of its active grants, and fails if they never are.
func hostsMatch(t *testing.T, admin *grpc.ClientConn, tree, sub string) {
	t.Helper()
	ctx := context.Background()
	var granted, allowed []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		granted, allowed = nil, nil
		req := &pb.ListGrantsRequest{State: pb.GrantState_GRANT_STATE_ACTIVE, PageSize: 1000}
		for {
			resp, err := pb.NewAccessClient(admin).ListGrants(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range resp.Grants {
				if g.SubsystemNqn == sub && !slices.Contains(granted, g.HostNqn) {
					granted = append(granted, g.HostNqn)
				}
			}
			if req.PageToken = resp.NextPageToken; req.PageToken == "" {
				break
			}
		}
		ents, _ := os.ReadDir(filepath.Join(tree, "subsystems", sub, "allowed_hosts"))
		for _, e := range ents {
			allowed = append(allowed, e.Name())
		}
		slices.Sort(granted)
		slices.Sort(allowed)
		if slices.Equal(granted, allowed) {
			t.Logf("the agent's target holds exactly the %d hosts of the active grants on %s", len(allowed), sub)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's target allows %d hosts %v; the active grants name %d: %v", len(allowed), allowed, len(granted), granted)
		}
	}
}
