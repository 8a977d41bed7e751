package lineage_test

import (
	"context"
	"crypto/rand"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/lineage"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// fixture: a real log with two jobs' entries, and job-1's lineage.
func fixture(t testing.TB) ([]byte, attest.PublicKey, *audit.Log) {
	t.Helper()
	k, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewLocalSigner(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(filepath.Join(t.TempDir(), "a.db"), audit.Options{Origin: "test/log", Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	ns := []audit.Namespace{{SubsystemNQN: "nqn.2026-01.io.x:s", NSID: 1, Mode: "ro", Dataset: "ds", DatasetDigest: digest}}
	for i, e := range []audit.Entry{
		{Kind: audit.EventJobAdmit, JobID: "job-1", Tenant: "acme", Namespaces: ns, Decision: &audit.Decision{Allow: true, ID: "d1", PolicyRevision: "r1"}},
		{Kind: audit.EventJobAdmit, JobID: "job-2", Tenant: "globex"},
		{Kind: audit.EventGrant, JobID: "job-1", Tenant: "acme", Namespaces: ns, Keys: []audit.KeyRef{{Class: "access_root", ID: "nqn.2026-01.io.x:s", Version: 1, Fingerprint: "hmac-sha256:00"}}},
		{Kind: audit.EventJobFinish, JobID: "job-1", Tenant: "acme"},
	} {
		e.Time = time.Date(2026, 12, 1, 9, i, 0, 0, time.UTC)
		if _, _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	j := &nvmegate.Job{ID: "job-1", Tenant: "acme", Scheduler: "spiffe://x/tenant/acme/scheduler/s", Nodes: []string{"spiffe://x/node/n"},
		Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: "nqn.2026-01.io.x:s", NSID: 1, Mode: "ro"}}, State: nvmegate.JobFinished}
	st, err := lineage.Build(ctx, l, j, map[string]lineage.NamespaceUse{lineage.NamespaceKey("nqn.2026-01.io.x:s", 1): {Dataset: "ds", DatasetDigest: digest}})
	if err != nil {
		t.Fatal(err)
	}
	env, err := lineage.Sign(ctx, st, s)
	if err != nil {
		t.Fatal(err)
	}
	return env, s.PublicKey(), l
}

func TestBuildAndVerify(t *testing.T) {
	env, key, _ := fixture(t)
	rep, err := lineage.Verify(env, []attest.PublicKey{key})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Job != "job-1" || rep.Entries != 3 || rep.TreeSize != 4 || len(rep.Datasets) != 1 || rep.Datasets[0] != "ds@"+digest {
		t.Fatalf("report %+v", rep)
	}
	if !strings.Contains(string(env), `"payloadType": "application/vnd.in-toto+json"`) {
		t.Fatalf("envelope: %s", env)
	}
}

// Nothing that does not come from the log verifies.
func TestVerifyRefuses(t *testing.T) {
	env, key, _ := fixture(t)
	for name, mutate := range map[string]func(string) string{
		"payload altered":  func(s string) string { return strings.Replace(s, `"payload": "`, `"payload": "eyJ4Ijox`, 1) },
		"signature zeroed": func(s string) string { return strings.Replace(s, `"sig": "`, `"sig": "AAAA`, 1) },
		"wrong type":       func(s string) string { return strings.Replace(s, "vnd.in-toto+json", "json", 1) },
		"not json":         func(s string) string { return s[:len(s)/2] },
	} {
		if _, err := lineage.Verify([]byte(mutate(string(env))), []attest.PublicKey{key}); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if _, err := lineage.Verify(env, nil); err == nil {
		t.Error("verified without keys")
	}
}

// The verifier never panics on input.
func FuzzVerify(f *testing.F) {
	env, key, _ := fixture(f)
	f.Add(env)
	f.Add([]byte(`{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		lineage.Verify(data, []attest.PublicKey{key})
	})
}
