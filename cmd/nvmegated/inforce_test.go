package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

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

// rotationPair is two replicas, a job's subsystem with a first root
// rotated through a, and kept: the root version b derives credentials
// from (the root it keeps), once b keeps the first root.
func rotationPair(t *testing.T) (a, b *Main, sub string, first keys.Root, kept func() uint64) {
	t.Helper()
	f := newFleet(t, 1)
	a, _ = f.replica(t, "a")
	b, _ = f.replica(t, "b")
	sub = acmeJob(t, f.dir, a.GRPCAddr(), b.GRPCAddr(), "stor-1")
	first, err := a.keys.Rotate(ctxT(t), sub, "first root")
	if err != nil {
		t.Fatal(err)
	}
	kept = func() uint64 {
		c, err := b.keys.Credentials(ctxT(t), "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001", sub, keys.CredentialParams{DHCHAPHash: nvmefmt.SHA256})
		if err != nil {
			t.Fatal(err)
		}
		return c.RootVersion
	}
	waitUntil(t, "b keeping the first root", func() bool { return kept() == first.Version })
	return a, b, sub, first, kept
}

// An access root rotated through one replica is dropped by the other as
// it applies the change that notes it: the next credentials there derive
// from the new root, not the one it kept until its next refresh.
func TestRotationReachesEveryReplica(t *testing.T) {
	a, _, sub, first, kept := rotationPair(t)
	rotated, err := a.keys.Rotate(ctxT(t), sub, "suspected compromise")
	if err != nil || rotated.Version != first.Version+1 {
		t.Fatalf("rotate through a: %+v %v", rotated, err)
	}
	// Within the wait, well before b's refresh (30 s) would read it.
	waitUntil(t, "b deriving from the new root", func() bool { return kept() == rotated.Version })
}

// A rotation Vault took and the store never noted (its replica died in
// between) is noted by the leader's reconciliation: the other replicas
// drop the old root then.
func TestRotationReconciledByLeader(t *testing.T) {
	a, b, sub, first, kept := rotationPair(t)
	waitUntil(t, "a leader", func() bool { return a.repl.elector.Leading() != b.repl.elector.Leading() })
	// Vault takes a rotation the store never hears of.
	now := time.Now()
	if _, err := a.keyStore.AddRoot(ctxT(t), sub, first.Version, make([]byte, keys.RootSize), now, now.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	// The leader's reconciliation notes it (at the start of a term; here
	// called as a new term would).
	lead := a
	if b.repl.elector.Leading() {
		lead = b
	}
	lead.reconcileRotations(ctxT(t))
	waitUntil(t, "b deriving from the root Vault took", func() bool { return kept() == first.Version+1 })
}

// While a replica of an older version runs (a rolling upgrade: its
// election value names no record kinds), the leader writes no record that
// replica could not apply: no policy record, no root note. Once it is
// gone, they are written.
func TestOlderReplicaHoldsNewRecords(t *testing.T) {
	f := newFleet(t, 1)
	policyDir := t.TempDir()
	copyDefaultPolicy(t, policyDir)
	a, _ := f.replica(t, "a", "--policy-dir", policyDir, "--policy-reload-interval", "1h")
	waitUntil(t, "a leading", a.repl.elector.Leading)
	waitUntil(t, "a's policy in force", func() bool { return a.db.Policy() != nil })
	before := a.db.Policy().Digest
	older := a.repl.prefix + "leader/older-replica"
	if _, err := a.repl.client.Put(ctxT(t), older, `{"name":"older","peer":"192.0.2.1:7444"}`); err != nil {
		t.Fatal(err)
	}
	rego := filepath.Join(policyDir, "authz.rego")
	src, err := os.ReadFile(rego)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rego, append(src, []byte("\n# during the upgrade\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	if a.reloader.check(ctxT(t)) || a.db.Policy().Digest != before {
		t.Fatal("a policy record was written while an older replica runs")
	}
	sub := acmeJob(t, f.dir, a.GRPCAddr(), a.GRPCAddr(), "stor-1")
	if _, err := a.keys.Rotate(ctxT(t), sub, "during the upgrade"); err != nil {
		t.Fatal(err)
	}
	if noted, err := a.db.NotedRoots(ctxT(t)); err != nil || len(noted) != 0 {
		t.Fatalf("root notes %v (%v) while an older replica runs", noted, err)
	}
	if _, err := a.repl.client.Delete(ctxT(t), older); err != nil {
		t.Fatal(err)
	}
	if !a.reloader.check(ctxT(t)) || a.db.Policy().Digest == before {
		t.Fatal("the policy was not made the one in force once every replica applies it")
	}
}
