package gateway_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/compliance"
	"github.com/nvmegate/nvmegate/gateway"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// An auditor gets a compliance attestation that verifies offline with the
// log's key: it states the namespace (placement, residency, key ages
// against its class's rotation period) and the grant, anchored to a
// checkpoint, and the log records its digest. After the residency is
// tightened it names the namespace and the grant out of compliance. A
// tampered bundle, a wrong key and a caller who is not an auditor or admin
// are refused.
func TestComplianceAttestation(t *testing.T) {
	var skew time.Duration
	g, ctx := usWestGateway(t, func(c *gateway.Config) { c.Now = func() time.Time { return time.Now().Add(skew) } })
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	// The namespace's data key (and so its key-encryption key) exists.
	if _, err := pb.NewKeysClient(g.client(t, admin)).Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY,
		SubsystemNqn: subNQN, Nsid: 1, Reason: "first use"}); err != nil {
		t.Fatal(err)
	}
	ac := pb.NewAuditClient(g.client(t, auditor))
	resp, err := ac.Compliance(ctx, &pb.ComplianceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []attest.PublicKey{g.auditKey}
	rep, err := compliance.Verify(resp.Bundle, keys)
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Predicate
	if resp.OutOfCompliance != 0 || len(rep.OutOfCompliance) != 0 || rep.Namespaces != 1 || rep.Grants != 1 || rep.PolicyRevision != g.engine.Status().Revision {
		t.Fatalf("report %+v", rep)
	}
	if len(p.Tenants) != 1 || p.Tenants[0].Name != "acme" {
		t.Fatalf("tenants %+v", p.Tenants)
	}
	ns := p.Tenants[0].Namespaces[0]
	if !ns.Residency.OK || ns.Region != "us-west" || ns.Target != "stor-eu-1" || ns.RotateEvery != "2160h0m0s" ||
		ns.AccessRoot.Version != 1 || !ns.AccessRoot.WithinPeriod || ns.AccessRoot.Name != "target:stor-eu-1" || ns.KEK.Version == 0 {
		t.Fatalf("namespace %+v", ns)
	}
	// The operator's namespace (no backing device): not vouched for as
	// encrypted; its data key's age is stated all the same.
	if ns.AtRest.Encrypted || ns.AtRest.Cipher != "" || ns.AtRest.DataKey.Version != 1 || ns.AtRest.DataKey.CreatedAt.IsZero() ||
		ns.AtRest.DataKey.Name != subNQN+"/1" {
		t.Fatalf("at rest %+v", ns.AtRest)
	}
	if gr := p.Grants[0]; gr.ID != c.Grant.GrantId || gr.Verdict != "allowed" {
		t.Fatalf("grant %+v", gr)
	}
	// The log's entry at the index names the envelope's digest.
	recs, _, err := g.audit.Query(ctx, audit.Filter{Kinds: []audit.EventKind{audit.EventComplianceAttestation}}, audit.Page{})
	if err != nil || len(recs) != 1 || recs[0].Index != resp.Index || !strings.HasPrefix(recs[0].Entry.Detail, "sha256:") {
		t.Fatalf("attestation entries %+v (%v)", recs, err)
	}

	// Within a minute, a caller gets the same attestation, not a new one.
	if again, err := ac.Compliance(ctx, &pb.ComplianceRequest{}); err != nil || again.Index != resp.Index {
		t.Fatalf("a second call within the minute: index %d (%v), want %d", again.GetIndex(), err, resp.Index)
	}

	// Tightened residency: the attestation names the namespace and the grant.
	if err := g.engine.Reload(ctx, policyWith(t, usWest, usWestMoved), "residency-tightened"); err != nil {
		t.Fatal(err)
	}
	skew = 2 * time.Minute
	resp2, err := ac.Compliance(ctx, &pb.ComplianceRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rep2, err := compliance.Verify(resp2.Bundle, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep2.OutOfCompliance) != 2 || rep2.Predicate.Tenants[0].Namespaces[0].Residency.OK || rep2.Predicate.Grants[0].Verdict != "revoke" ||
		!strings.Contains(strings.Join(rep2.OutOfCompliance, "\n"), c.Grant.GrantId) {
		t.Fatalf("after the change: %+v", rep2.OutOfCompliance)
	}

	// Tampering and the wrong key fail.
	var b compliance.Bundle
	if err := json.Unmarshal(resp.Bundle, &b); err != nil {
		t.Fatal(err)
	}
	tamper := func(name string, f func(*compliance.Bundle)) {
		c := b
		c.Proof = append([]string(nil), b.Proof...)
		f(&c)
		raw, _ := json.Marshal(c)
		if _, err := compliance.Verify(raw, keys); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	tamper("payload", func(c *compliance.Bundle) {
		c.Envelope = bytes.Replace(c.Envelope, []byte(`"payload": "`), []byte(`"payload": "e30`), 1)
	})
	tamper("index", func(c *compliance.Bundle) { c.Index-- })
	tamper("entry", func(c *compliance.Bundle) { c.Entry = rep2.Predicate.Log.Checkpoint })
	tamper("checkpoint", func(c *compliance.Bundle) { c.Checkpoint = rep.Predicate.Log.Checkpoint })
	other, err := attest.GenerateKey(attest.Ed25519, nil)
	if err == nil {
		ls, _ := attest.NewLocalSigner(other, 1)
		if _, err := compliance.Verify(resp.Bundle, []attest.PublicKey{ls.PublicKey()}); err == nil || !strings.Contains(err.Error(), "bad_signature") {
			t.Errorf("another key: %v", err)
		}
	}
	// Only auditors and admins.
	for _, who := range []string{node, sched, "/target/stor-eu-1"} {
		if _, err := pb.NewAuditClient(g.client(t, who)).Compliance(ctx, &pb.ComplianceRequest{}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", who, err)
		}
	}
}
