package gateway_test

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/lineage"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// A finished job's lineage: signed, with the job's dataset as subject and
// every entry of the job provably in the log; it verifies offline with the
// log's public key, and fails when altered or checked with another key.
func TestLineage(t *testing.T) {
	g, ctx := admittedGateway(t)
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	fin, err := pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Finishing returns the signed lineage already.
	if rep, err := lineage.Verify(fin.Lineage, []attest.PublicKey{g.auditKey}); err != nil || rep.Job != "job-1" {
		t.Fatalf("lineage at finish: %v %v", rep, err)
	}
	resp, err := pb.NewAuditClient(g.client(t, auditor)).Lineage(ctx, &pb.LineageRequest{JobId: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := lineage.Verify(resp.Envelope, []attest.PublicKey{g.auditKey})
	if err != nil {
		t.Fatal(err)
	}
	// admit, grant, finish (and the finish's revocation of the grant is
	// recorded by the key manager, not under the job).
	if rep.Job != "job-1" || rep.Tenant != "acme" || rep.Entries < 3 || len(rep.Datasets) != 1 ||
		rep.Datasets[0] != "common-crawl/2026-10@"+digest {
		t.Fatalf("report %+v", rep)
	}
	// Altered: the payload's job ID changed.
	bad := bytes.Replace(resp.Envelope, []byte(`"payload": "`), []byte(`"payload": "AAAA`), 1)
	if _, err := lineage.Verify(bad, []attest.PublicKey{g.auditKey}); err == nil {
		t.Fatal("an altered envelope verified")
	}
	other, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := attest.NewLocalSigner(other, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lineage.Verify(resp.Envelope, []attest.PublicKey{ls.PublicKey()}); err == nil || !strings.Contains(err.Error(), "bad_signature") {
		t.Fatalf("another key: %v", err)
	}
	// Only auditors and admins get lineage.
	_, err = pb.NewAuditClient(g.client(t, sched)).Lineage(ctx, &pb.LineageRequest{JobId: "job-1"})
	wantCode(t, err, codes.PermissionDenied)
}
