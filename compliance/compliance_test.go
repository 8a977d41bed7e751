package compliance_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/compliance"
)

// record makes a real log with a few entries and records an attestation
// of p in it; it returns the bundle's JSON and the log's key.
func record(t testing.TB, p *compliance.Predicate) ([]byte, attest.PublicKey, *audit.Log) {
	t.Helper()
	key, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewLocalSigner(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: "test/compliance", Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	for range 3 {
		if _, _, err := l.Append(ctx, audit.Entry{Kind: audit.EventPolicyLoad, Detail: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	cp, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := compliance.Statement(p, cp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := compliance.Record(ctx, l, st, s, cp.Size, "spiffe://test/gateway/g")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return raw, s.PublicKey(), l
}

func predicate() *compliance.Predicate {
	return &compliance.Predicate{Time: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), PolicyRevision: "r1", DataRevision: 7,
		Tenants: []compliance.Tenant{{Name: "acme", Namespaces: []compliance.Namespace{{SubsystemNQN: "nqn.2026-01.io.x:a", NSID: 1,
			Residency: compliance.Verdict{OK: true}}}}}, OutOfCompliance: []string{}}
}

// A recorded attestation verifies, says what it states, and is proved in
// the log after its anchor; the log's entry names its digest.
func TestRecordVerify(t *testing.T) {
	raw, pub, _ := record(t, predicate())
	rep, err := compliance.Verify(raw, []attest.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PolicyRevision != "r1" || rep.Namespaces != 1 || rep.AnchorSize != 3 || rep.RecordedAt != 3 || rep.TreeSize != 4 {
		t.Fatalf("report %+v", rep)
	}
}

// A bundle recording another attestation's entry (the digest of another
// envelope) does not verify.
func TestVerifyRefusesAnotherAttestationsEntry(t *testing.T) {
	rawA, pub, _ := record(t, predicate())
	var a compliance.Bundle
	if err := json.Unmarshal(rawA, &a); err != nil {
		t.Fatal(err)
	}
	p := predicate()
	p.PolicyRevision = "r2"
	rawB, pubB, _ := record(t, p)
	var b compliance.Bundle
	if err := json.Unmarshal(rawB, &b); err != nil {
		t.Fatal(err)
	}
	b.Envelope = a.Envelope // A's statement, B's log
	mixed, _ := json.Marshal(b)
	if _, err := compliance.Verify(mixed, []attest.PublicKey{pub, pubB}); err == nil {
		t.Fatal("a bundle mixing two attestations verified")
	}
}

// FuzzVerify: the verifier never panics on any bundle, and nothing but
// the recorded bundle verifies under the log's key.
func FuzzVerify(f *testing.F) {
	raw, pub, _ := record(f, predicate())
	f.Add(raw)
	f.Add([]byte(`{"envelope":{}}`))
	f.Add([]byte(`{"envelope":{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[{"sig":"AA=="}]},"proof":["!"]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := compliance.Verify(data, []attest.PublicKey{pub})
		if err == nil && string(data) != string(raw) {
			// Another JSON spelling of the same bundle may verify; its
			// content must be the recorded one.
			if rep.PolicyRevision != "r1" || rep.RecordedAt != 3 {
				t.Fatalf("a different bundle verified: %+v", rep)
			}
		}
		if err != nil && !strings.HasPrefix(err.Error(), "compliance: ") {
			t.Fatalf("error without its package: %v", err)
		}
	})
}
