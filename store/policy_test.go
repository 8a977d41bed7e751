package store_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

func policyOf(digest string) *store.Policy {
	return &store.Policy{Revision: "r-" + digest, Digest: "sha256:" + digest, Source: "test",
		Files: map[string][]byte{"authz.rego": []byte("package nvmegate.authz\n# " + digest + "\n")}}
}

// A policy load is a change: the policy is in force once it returns, its
// policy_load entry is in the same commit, the hook hears of it, a load
// of the same digest writes nothing, and a reopened store (a replay)
// serves it again.
func TestLoadPolicy(t *testing.T) {
	dir := t.TempDir()
	log, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/policy"})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	var mu sync.Mutex
	var heard []string
	hook := func(p *store.Policy) { mu.Lock(); heard = append(heard, p.Digest); mu.Unlock() }
	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: log, PolicyLoaded: hook})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if db.Policy() != nil {
		t.Fatal("a new store has a policy")
	}
	entry := audit.Entry{Kind: audit.EventPolicyLoad, Caller: "spiffe://nvmegate.test/nvmegated", Detail: "policy a loaded"}
	loaded, err := db.LoadPolicy(ctx, policyOf("a"), entry)
	if err != nil || !loaded {
		t.Fatalf("load a: %v %v", loaded, err)
	}
	if p := db.Policy(); p == nil || p.Digest != "sha256:a" || p.LoadedAt.IsZero() {
		t.Fatalf("in force: %+v", p)
	}
	rev, size := db.Revision(), log.Size()
	if loaded, err := db.LoadPolicy(ctx, policyOf("a"), entry); err != nil || loaded {
		t.Fatalf("the same policy again: loaded %v, %v", loaded, err)
	}
	if db.Revision() != rev || log.Size() != size {
		t.Fatal("loading the policy in force again wrote a change or an entry")
	}
	recs, _, err := log.Query(ctx, audit.Filter{Kinds: []audit.EventKind{audit.EventPolicyLoad}}, audit.Page{Size: 10})
	if err != nil || len(recs) != 1 || recs[0].Entry.Change == nil {
		t.Fatalf("policy_load entries %+v (%v): want one, recording the change", recs, err)
	}
	if _, err := db.LoadPolicy(ctx, policyOf("b"), entry); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(heard) != 2 || heard[0] != "sha256:a" || heard[1] != "sha256:b" {
		t.Fatalf("the hook heard %v", heard)
	}
	mu.Unlock()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: log})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if p := db.Policy(); p == nil || p.Digest != "sha256:b" || string(p.Files["authz.rego"]) != string(policyOf("b").Files["authz.rego"]) {
		t.Fatalf("after a reopen: %+v", p)
	}
}

// A bundle too large for one commit of the replicated log is refused
// with a message that says so.
func TestLoadPolicyTooLarge(t *testing.T) {
	db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := policyOf("big")
	p.Files["data.json"] = make([]byte, store.MaxPolicyBytes)
	_, err = db.LoadPolicy(context.Background(), p, audit.Entry{Kind: audit.EventPolicyLoad})
	if err == nil || db.Policy() != nil {
		t.Fatalf("a policy of %d bytes: %v", store.MaxPolicyBytes, err)
	}
}

// A root rotation noted in the store reaches the hook (every replica's, as
// it applies the change); an older or the same version writes nothing.
func TestNoteRootRotated(t *testing.T) {
	dir := t.TempDir()
	log, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/roots"})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	var mu sync.Mutex
	var heard []string
	db, err := store.Open(filepath.Join(dir, "store.db"), store.Options{Journal: log, RootRotated: func(scope string, v uint64) {
		mu.Lock()
		heard = append(heard, fmt.Sprintf("%s@%d", scope, v))
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	const sub = "nqn.2026-01.io.nvmegate:sub-1"
	if err := db.NoteRootRotated(ctx, store.RootRotation{Scope: sub, Version: 2, Fingerprint: "sha256:abcd"}); err != nil {
		t.Fatal(err)
	}
	rev := db.Revision()
	for _, v := range []uint64{1, 2} {
		if err := db.NoteRootRotated(ctx, store.RootRotation{Scope: sub, Version: v, Fingerprint: "sha256:old"}); err != nil {
			t.Fatal(err)
		}
	}
	if db.Revision() != rev {
		t.Fatal("an older rotation was noted")
	}
	if err := db.NoteRootRotated(ctx, store.RootRotation{Scope: sub, Version: 3, Fingerprint: "sha256:ef01"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(heard) != "["+sub+"@2 "+sub+"@3]" {
		t.Fatalf("the hook heard %v", heard)
	}
}
