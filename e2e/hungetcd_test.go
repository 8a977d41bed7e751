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
	"go.uber.org/zap"

	"github.com/nvmegate/nvmegate/loadgen"
)

// connectAttempt is one connect of the hung-member test.
type connectAttempt struct {
	replica    int
	start, end time.Time
	ok         bool
	err        string
}

// One etcd follower of three frozen (SIGSTOP: its process hangs, its
// kernel still accepts connections and bytes; the quorum holds), under
// connects through each of three replicas configured with all three
// endpoints. Within 5 s of the freeze — the target of issue 29, defect 6
// — connects through every replica succeed again, and go on succeeding
// while the member stays frozen; resumed (SIGCONT), it is used again and
// connects still succeed. Before, none succeeded for as long as the member
// was frozen: each waited the read barrier's 10 s on a read the frozen
// member held.
//
// The measure: a connect is bad if it fails or takes over 3 s (a
// connect's p99 on this machine is well under that, and reported); a
// replica has recovered from the end of its last bad connect started
// during the freeze. The bound asserted is 10 s, twice the target, for
// a noisy CI machine; the figure is logged.
//
//	NVMEGATE_VAULT=$(scripts/build-vault.sh) go test -run TestHungEtcdMember -v ./e2e/
func TestHungEtcdMember(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	needVault(t)
	const (
		slow      = 3 * time.Second  // a connect slower than this is bad
		bound     = 10 * time.Second // asserted; the target is 5 s
		frozenFor = 25 * time.Second
	)
	bin, work, v, role, etcd := replicaStack(t)
	dev := filepath.Join(work, "dev")
	replicas := startReplicas(t, bin, work, dev, 3, replicaConfig{vault: v.Addr, role: role, keyDir: filepath.Join(work, "audit-keys"),
		endpoints: etcd.endpoints})
	_, fleets := loadOn(t, dev, replicas, 36, 3, "hung")

	// A follower of etcd's leader, to freeze; a client of the others.
	frozen := -1
	for i, ep := range etcd.endpoints {
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := cl.Status(sctx, ep)
		scancel()
		cl.Close()
		if err != nil {
			t.Fatalf("etcd member e%d: %v", i, err)
		}
		if st.Header.MemberId != st.Leader && frozen < 0 {
			frozen = i
		}
	}
	if frozen < 0 {
		t.Fatal("no etcd follower")
	}
	var healthy []string
	for i, ep := range etcd.endpoints {
		if i != frozen {
			healthy = append(healthy, ep)
		}
	}
	hcl, err := clientv3.New(clientv3.Config{Endpoints: healthy, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer hcl.Close()
	leaderName := func() string {
		lctx, lcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer lcancel()
		resp, err := hcl.Get(lctx, "/nvmegate/leader/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil || len(resp.Kvs) == 0 {
			return ""
		}
		return electedName(resp.Kvs[0].Value)
	}
	// Connects through every replica: every 200 ms, one of a node not
	// already connecting (12 nodes each), each on its own.
	var (
		mu       sync.Mutex
		attempts []connectAttempt
		launch   sync.WaitGroup
		inflight sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	for i, f := range fleets {
		free := make(chan int, len(f.Nodes))
		for n := range f.Nodes {
			free <- n
		}
		launch.Add(1)
		go func() {
			defer launch.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				var n int
				select {
				case n = <-free:
				default:
					continue // every node is connecting
				}
				inflight.Add(1)
				go func() {
					defer inflight.Done()
					one := &loadgen.Fleet{Subsystem: f.Subsystem, Jobs: f.Jobs, Nodes: []*loadgen.Node{f.Nodes[n]}}
					a := connectAttempt{replica: i, start: time.Now()}
					r := loadgen.Run(context.Background(), one, loadgen.Options{Concurrency: 1, Requests: 1, Duration: 30 * time.Second, RunID: fmt.Sprintf("hung%d", i)})
					a.end, a.ok = time.Now(), len(r.Acks) == 1
					if !a.ok {
						a.err = strings.Join(r.FirstErrors, "; ")
						if a.err == "" {
							a.err = "no answer in 30 s"
						}
					}
					mu.Lock()
					attempts = append(attempts, a)
					mu.Unlock()
					free <- n
				}()
			}
		}()
	}
	stopLoad := func() { cancel(); launch.Wait(); inflight.Wait() }
	defer stopLoad()
	between := func(from, to time.Time) []connectAttempt {
		mu.Lock()
		defer mu.Unlock()
		var out []connectAttempt
		for _, a := range attempts {
			if !a.start.Before(from) && a.start.Before(to) {
				out = append(out, a)
			}
		}
		return out
	}

	// Warm: every connect succeeds.
	leaderBefore := leaderName()
	warm := time.Now()
	time.Sleep(5 * time.Second)
	var lat []time.Duration
	for _, a := range between(warm, time.Now()) {
		if !a.ok {
			data, _ := os.ReadFile(replicas[a.replica].log)
			t.Fatalf("a connect through r%d failed before any member was frozen: %s\nits log:\n%s", a.replica, a.err, data)
		}
		lat = append(lat, a.end.Sub(a.start))
	}
	if len(lat) == 0 {
		t.Fatal("no connect in the first 5 s")
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]

	marks := make([]int64, len(replicas))
	for i, r := range replicas {
		marks[i] = fileSize(r.log)
	}
	member := etcd.members[frozen].proc.cmd.Process
	if err := member.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	froze := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			member.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	time.Sleep(frozenFor)
	resume()
	thawed := time.Now()
	leaderAfter := leaderName()
	// The connects begun while it was frozen end (30 s at most each).
	time.Sleep(5 * time.Second)
	stopLoad()

	recovered := make([]time.Duration, len(replicas))
	var (
		bad, okN      = make([]int, len(replicas)), make([]int, len(replicas))
		firstErr      = make([]string, len(replicas))
		afterRecovery = make([]int, len(replicas))
		during        = between(froze, thawed)
	)
	for _, a := range during {
		if !a.ok || a.end.Sub(a.start) > slow {
			bad[a.replica]++
			recovered[a.replica] = max(recovered[a.replica], a.end.Sub(froze))
			if firstErr[a.replica] == "" {
				why := a.err
				if a.ok {
					why = "slow"
				}
				firstErr[a.replica] = fmt.Sprintf("%s after %s", why, a.end.Sub(a.start).Round(time.Millisecond))
			}
		} else {
			okN[a.replica]++
		}
	}
	for _, a := range during {
		if a.ok && a.start.Sub(froze) >= recovered[a.replica] {
			afterRecovery[a.replica]++
		}
	}
	// Also: the slowest connect begun during the freeze, and when they
	// were fast again (none over 1 s after that).
	var slowest, fast time.Duration
	for _, a := range during {
		d := a.end.Sub(a.start)
		slowest = max(slowest, d)
		if !a.ok || d > time.Second {
			fast = max(fast, a.end.Sub(froze))
		}
	}
	var (
		worst time.Duration
		lines []string
	)
	for i := range replicas {
		worst = max(worst, recovered[i])
		l := fmt.Sprintf("r%d: %s (%d ok, %d bad", i, recovered[i].Round(time.Millisecond), okN[i], bad[i])
		if firstErr[i] != "" {
			l += ", the first: " + firstErr[i]
		}
		lines = append(lines, l+")")
	}
	t.Logf("etcd follower e%d frozen for %s: connects through every replica succeed again (none failed or over %s) %s after the freeze — %s; "+
		"none over 1 s from %s after it; the slowest begun during the freeze %s; unfrozen p50 %s, p99 %s; leader %q before, %q after",
		frozen, frozenFor, slow, worst.Round(time.Millisecond), strings.Join(lines, "; "), fast.Round(time.Millisecond), slowest.Round(time.Millisecond),
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), leaderBefore, leaderAfter)
	for i, r := range replicas {
		if data, err := os.ReadFile(r.log); err == nil && int64(len(data)) > marks[i] {
			for _, l := range strings.Split(string(data[marks[i]:]), "\n") {
				if strings.Contains(l, "etcd member") {
					t.Logf("r%d: %s", i, l)
				}
			}
		}
	}
	if worst > bound {
		t.Errorf("connects failed or were slow until %s after the freeze; the target is 5 s (asserted: %s)", worst.Round(time.Millisecond), bound)
	}
	for i := range replicas {
		if afterRecovery[i] < 10 {
			t.Errorf("r%d: %d connects succeeded after it recovered, with the member frozen", i, afterRecovery[i])
		}
	}
	// Resumed, the member is used again: the connects since succeed.
	var since []string
	for _, a := range between(thawed.Add(2*time.Second), time.Now()) {
		if !a.ok {
			since = append(since, fmt.Sprintf("r%d: %s", a.replica, a.err))
		}
	}
	if len(since) > 0 {
		t.Errorf("%d connects failed after the member resumed, e.g. %s", len(since), since[0])
	}
}
