package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/audit"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The leader trims etcd's log to its tail once both copies hold it, and a
// replica started afterwards on an empty disk fills the history from the
// leader's copy: its log is the same tree and its store the same state.
func TestLogTrimmedNewReplicaFillsHistory(t *testing.T) {
	f := newFleet(t, 1)
	f.tune = func(c *EtcdConfig) { c.LogTrimEvery, c.LogKeep, c.LogCopies = "1s", 1, 2 }
	a, _ := f.replica(t, "a")
	b, _ := f.replica(t, "b")
	sub := acmeJob(t, f.dir, a.GRPCAddr(), b.GRPCAddr(), "stor-1")
	resp, err := pb.NewAccessClient(devConn(t, b.GRPCAddr(), f.dir, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	// The log holds the policy loads, the inventory, the job and the
	// grant (9 entries): all but the last go from etcd.
	waitUntil(t, "etcd's log trimmed to its tail", func() bool {
		return a.tail.start.Load() >= 5 && b.tail.start.Load() >= 5
	})
	start := a.tail.start.Load()

	c, _ := f.replica(t, "c")
	waitUntil(t, "the new replica's copy holding the log", func() bool { return c.audit.Size() >= a.audit.Size() })
	waitUntil(t, "the new replica reading where the tail starts", func() bool { return c.tail.start.Load() >= start })
	size := a.audit.Size()
	ra, err := a.audit.RootAt(ctxT(t), size)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := c.audit.RootAt(ctxT(t), size); err != nil || rc != ra {
		t.Fatalf("the new replica's copy is another tree at %d (%v)", size, err)
	}
	waitUntil(t, "the new replica's store at the leader's revision", func() bool { return c.db.Revision() == a.db.Revision() })
	g, err := c.db.Grant(ctxT(t), resp.Grant.GrantId)
	if err != nil || g.HostNQN != resp.Grant.HostNqn {
		t.Fatalf("the new replica lacks the grant made before the trim: %+v, %v", g, err)
	}
}

// Replicas decide under one policy: the leader's source makes it the one
// in force (a change of the log), and every replica swaps to it as it
// applies that change — a follower's own policy files do not.
func TestOnePolicyForEveryReplica(t *testing.T) {
	f := newFleet(t, 1)
	dirs := map[string]string{"a": t.TempDir(), "b": t.TempDir()}
	ms := map[string]*Main{}
	for _, name := range []string{"a", "b"} {
		copyDefaultPolicy(t, dirs[name])
		ms[name], _ = f.replica(t, name, "--policy-dir", dirs[name], "--policy-reload-interval", "100ms")
	}
	waitUntil(t, "a leader", func() bool { return ms["a"].repl.elector.Leading() != ms["b"].repl.elector.Leading() })
	lead, follow := "a", "b"
	if ms["b"].repl.elector.Leading() {
		lead, follow = "b", "a"
	}
	waitUntil(t, "the leader's policy in force in the store", func() bool { return ms[lead].db.Policy() != nil })

	edit := func(name, note string) {
		t.Helper()
		rego := filepath.Join(dirs[name], "authz.rego")
		src, err := os.ReadFile(rego)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(rego, append(src, []byte("\n# "+note+"\n")...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := ms[follow].engine.Status().Digest
	edit(follow, "only the follower's files")
	edit(lead, "reviewed and approved")
	waitUntil(t, "the leader's new policy in force", func() bool {
		p := ms[lead].db.Policy()
		return p != nil && p.Digest != before
	})
	want := ms[lead].db.Policy().Digest
	waitUntil(t, "the follower deciding under the leader's policy", func() bool {
		return ms[follow].engine.Status().Digest == want
	})
	if got := ms[lead].engine.Status().Digest; got != want {
		t.Fatalf("the leader decides under %s, the policy in force is %s", got, want)
	}
	recs, _, err := ms[follow].audit.Query(ctxT(t), audit.Filter{Kinds: []audit.EventKind{audit.EventPolicyLoad}}, audit.Page{Size: 100})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		found = found || r.Entry.Change != nil && strings.Contains(r.Entry.Detail, want) && strings.Contains(r.Entry.Detail, "in force on every replica")
	}
	if !found {
		t.Fatalf("no policy_load entry records the change to %s", want)
	}
}
