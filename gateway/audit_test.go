package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/internal/logbuf"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// queryAll reads every entry of the log as the auditor, through the RPC.
func queryAll(t *testing.T, c pb.AuditClient, req *pb.QueryRequest) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	for {
		resp, err := c.Query(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.Entries {
			d, err := audit.DecodeEntry(e.Entry)
			if err != nil {
				t.Fatalf("entry %d: %v", e.Index, err)
			}
			if d.Caller != e.Caller || string(d.Kind) != e.Kind || d.JobID != e.JobId {
				t.Fatalf("entry %d: summary %v disagrees with the entry bytes %+v", e.Index, e, d)
			}
			out = append(out, d)
		}
		if resp.NextPageToken == "" {
			return out
		}
		req.PageToken = resp.NextPageToken
	}
}

var decisionIDRE = regexp.MustCompile(`decision ([0-9a-f-]{36})`)

// Every change is in the log before its answer, with the decision that
// allowed it; every refusal is in the log with the decision that refused it;
// a change that fails leaves a second entry saying so.
func TestAuditRecordsChangesAndRefusals(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	// One entry: the call's, recorded in the commit of the change it
	// made (the store is journaled in the log).
	if g.audit.Size() != 1 {
		t.Fatalf("log has %d entries after one change, want 1", g.audit.Size())
	}
	if e := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{}); len(e) != 1 || e[0].Change == nil {
		t.Fatalf("the change's entry %+v does not carry the change", e)
	}
	_, err := pb.NewInventoryClient(g.client(t, node)).AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()})
	wantCode(t, err, codes.PermissionDenied)
	m := decisionIDRE.FindStringSubmatch(status.Convert(err).Message())
	if m == nil {
		t.Fatalf("no decision ID in %q", err)
	}
	_, err = inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()}); err != nil {
		t.Fatal(err)
	}
	// Reads are not recorded.
	if _, err := inv.GetTarget(ctx, &pb.GetTargetRequest{Id: "stor-eu-1"}); err != nil {
		t.Fatal(err)
	}

	// The state changes the writes made are the store's entries (the
	// store is journaled in the log); this test is about the calls'.
	var got []audit.Entry
	for _, e := range queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{PageSize: 2}) {
		if e.Kind != audit.EventStateChange {
			got = append(got, e)
		}
	}
	type want struct {
		kind   audit.EventKind
		caller string
		allow  bool
		detail string
		tenant string
	}
	wants := []want{
		{audit.EventInventoryChange, admin, true, "inventory.add_target stor-eu-1", ""},
		{audit.EventDeny, node, false, "inventory.add_target stor-eu-1", ""},
		{audit.EventInventoryChange, admin, true, "inventory.add_target stor-eu-1", ""},
		{audit.EventInventoryChange, admin, true, "inventory.add_target stor-eu-1 failed (exists)", ""},
		{audit.EventInventoryChange, admin, true, "inventory.add_subsystem " + subNQN, "acme"},
		{audit.EventInventoryChange, admin, true, "inventory.add_namespace " + subNQN + "/1", "acme"},
	}
	if len(got) != len(wants) {
		for _, e := range got {
			t.Logf("%s %s %q", e.Kind, e.Caller, e.Detail)
		}
		t.Fatalf("%d entries, want %d", len(got), len(wants))
	}
	for i, w := range wants {
		e := got[i]
		if e.Kind != w.kind || e.Caller != "spiffe://nvmegate.test"+w.caller || e.Detail != w.detail || e.Tenant != w.tenant {
			t.Errorf("entry %d: %s %s %q tenant %q, want %+v", i, e.Kind, e.Caller, e.Detail, e.Tenant, w)
		}
		if e.Decision == nil || e.Decision.Allow != w.allow || e.Decision.ID == "" || e.Decision.PolicyRevision == "" {
			t.Errorf("entry %d: decision %+v, want allow=%v with an ID and revision", i, e.Decision, w.allow)
		}
	}
	if d := got[1].Decision; d.ID != m[1] || len(d.Reasons) == 0 {
		t.Errorf("deny entry: decision %+v, want ID %s (the one the caller was told) with reasons", d, m[1])
	}
	ns := got[5].Namespaces
	if len(ns) != 1 || ns[0].NSID != 1 || ns[0].Dataset != "common-crawl/2026-10" || ns[0].DatasetDigest != digest {
		t.Errorf("namespace entry: %+v", ns)
	}

	// Filters reach the log: only denials; only the tenant's entries.
	if d := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"deny"}}); len(d) != 1 || d[0].Kind != audit.EventDeny {
		t.Errorf("kinds=[deny]: %d entries", len(d))
	}
	if a := queryAll(t, pb.NewAuditClient(g.client(t, admin)), &pb.QueryRequest{Tenant: "acme"}); len(a) != 2 {
		t.Errorf("tenant=acme: %d entries, want 2", len(a))
	}
}

// Only auditors and admins read the log; other callers are refused by
// policy, and the refusal is itself recorded.
func TestAuditReadsArePolicyGated(t *testing.T) {
	g := startGateway(t)
	for _, who := range []string{sched, node} {
		_, err := pb.NewAuditClient(g.client(t, who)).Query(ctxT(t), &pb.QueryRequest{Tenant: "acme"})
		wantCode(t, err, codes.PermissionDenied)
		_, err = pb.NewAuditClient(g.client(t, who)).Checkpoint(ctxT(t), &pb.CheckpointRequest{})
		wantCode(t, err, codes.PermissionDenied)
	}
	got := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{})
	if len(got) != 4 {
		t.Fatalf("%d entries, want the 4 refusals", len(got))
	}
	for _, e := range got {
		if e.Kind != audit.EventDeny || !strings.HasPrefix(e.Detail, "audit.") {
			t.Errorf("entry %s %q, want a deny of an audit action", e.Kind, e.Detail)
		}
	}
}

// A change whose entry cannot be made durable is not made: the caller gets
// Unavailable and the store is unchanged. Refusals stay refusals.
func TestAuditFailClosed(t *testing.T) {
	g := startGateway(t)
	if err := g.audit.Close(); err != nil {
		t.Fatal(err)
	}
	inv := pb.NewInventoryClient(g.client(t, admin))
	_, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: validTarget()})
	wantCode(t, err, codes.Unavailable, "audit log unavailable", "nothing was changed")
	_, err = inv.GetTarget(ctxT(t), &pb.GetTargetRequest{Id: "stor-eu-1"})
	wantCode(t, err, codes.NotFound)
	_, err = pb.NewInventoryClient(g.client(t, node)).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: validTarget()})
	wantCode(t, err, codes.PermissionDenied)
	// A malformed request too: its entry cannot be made, and it is still
	// InvalidArgument (nothing was changed), not Unavailable.
	_, err = inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: &pb.Target{Id: "NOT A LABEL"}})
	wantCode(t, err, codes.InvalidArgument, "target.id")
}

// The auditor's read path end to end: a signed checkpoint, inclusion and
// consistency proofs that verify against it, and an export that the
// offline verifier accepts with the log's public key.
func TestAuditCheckpointProofsExport(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ac := pb.NewAuditClient(g.client(t, auditor))
	ctx := ctxT(t)

	_, err := ac.InclusionProof(ctx, &pb.InclusionProofRequest{Index: 0})
	wantCode(t, err, codes.FailedPrecondition, "no signed checkpoint")

	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	cp1, err := ac.Checkpoint(ctx, &pb.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()}); err != nil {
		t.Fatal(err)
	}
	cp2, err := ac.Checkpoint(ctx, &pb.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := []attest.PublicKey{g.auditKey}
	c1, _, err := audit.OpenCheckpoint(cp1.Checkpoint, keys)
	if err != nil {
		t.Fatal(err)
	}
	c2, _, err := audit.OpenCheckpoint(cp2.Checkpoint, keys)
	if err != nil {
		t.Fatal(err)
	}
	// A target and a subsystem: an entry each, recorded with the change;
	// a namespace (its keys are not the store's): the call's entry first,
	// then the state change's.
	if c1.Size != 1 || c2.Size != 4 || cp2.Size != 4 || string(cp2.RootHash) != string(c2.Hash[:]) {
		t.Fatalf("checkpoints of sizes %d and %d (response %d), want 1 and 4", c1.Size, c2.Size, cp2.Size)
	}

	for i := range uint64(4) {
		p, err := ac.InclusionProof(ctx, &pb.InclusionProofRequest{Index: i})
		if err != nil {
			t.Fatal(err)
		}
		if p.TreeSize != 4 {
			t.Fatalf("proof for tree size %d, want the latest checkpoint's 4", p.TreeSize)
		}
		if err := proof.VerifyInclusion(rfc6962.DefaultHasher, i, p.TreeSize, p.LeafHash, p.Hashes, c2.Hash[:]); err != nil {
			t.Fatalf("inclusion of %d: %v", i, err)
		}
	}
	cons, err := ac.ConsistencyProof(ctx, &pb.ConsistencyProofRequest{FromSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, 1, cons.ToSize, cons.Hashes, c1.Hash[:], c2.Hash[:]); err != nil {
		t.Fatal(err)
	}
	_, err = ac.InclusionProof(ctx, &pb.InclusionProofRequest{Index: 4})
	wantCode(t, err, codes.InvalidArgument, "not covered")
	_, err = ac.InclusionProof(ctx, &pb.InclusionProofRequest{Index: 1, TreeSize: 99})
	wantCode(t, err, codes.InvalidArgument, "beyond the log")

	// Export through the stream, then verify offline with the public key
	// only.
	dir := t.TempDir()
	stream, err := ac.Export(ctx, &pb.ExportRequest{})
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
		files++
	}
	rep, err := audit.Verify(ctx, dir, keys, cp1.Checkpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.TreeSize != 4 || rep.Entries != 4 {
		t.Fatalf("export of %d files: %+v", files, rep)
	}
	// The same export with an entry bundle altered fails verification.
	bundle := filepath.Join(dir, filepath.FromSlash(audit.EntryBundlePath(0, 4)))
	data, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(data), "stor-eu-1")
	if i < 0 {
		t.Fatal("target ID not found in the entry bundle")
	}
	data[i] = 'S'
	if err := os.WriteFile(bundle, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = audit.Verify(ctx, dir, keys, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Has(audit.KindModifiedEntry) {
		t.Fatalf("altered export: %+v", rep.Failures)
	}
}

// countingAudit counts the appends a gateway makes.
type countingAudit struct {
	gateway.AuditLog
	n *atomic.Int64
}

func (c countingAudit) Append(ctx context.Context, e audit.Entry) (uint64, [32]byte, error) {
	c.n.Add(1)
	return c.AuditLog.Append(ctx, e)
}

// A malformed request is refused with InvalidArgument and recorded before
// the answer, with one append: an invalid_argument entry naming the
// caller, the RPC and the field and rule that failed — never a value the
// caller sent, which may be key material pasted into the wrong field (the
// caller's own answer keeps it). Validation comes before policy: a caller
// policy would refuse is recorded the same way, and no deny entry is
// added. A flood costs one append per call; a peer without an SVID is
// refused in the handshake and records nothing.
func TestInvalidRequestsAreRecorded(t *testing.T) {
	var appends atomic.Int64
	g := startGateway(t, func(c *gateway.Config) { c.Audit = countingAudit{c.Audit, &appends} })
	ctx := ctxT(t)
	dhchap := "DHHC-1:01:" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")) + ":"
	psk := "NVMeTLSkey-1:01:" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")) + ":"
	rawKey := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	badTarget := validTarget()
	badTarget.Driver = psk
	cases := []struct {
		who, method, field string
		call               func(conn *grpc.ClientConn) error
		value              string // what the caller sent, in its answer, never in the log
	}{
		{node, "/nvmegate.v1.Access/Connect", "job_id", func(conn *grpc.ClientConn) error {
			_, err := pb.NewAccessClient(conn).Connect(ctx, &pb.ConnectRequest{JobId: dhchap, SubsystemNqn: subNQN})
			return err
		}, dhchap[:20]},
		{admin, "/nvmegate.v1.Inventory/GetTarget", "id", func(conn *grpc.ClientConn) error {
			_, err := pb.NewInventoryClient(conn).GetTarget(ctx, &pb.GetTargetRequest{Id: rawKey + "0"})
			return err
		}, rawKey},
		{admin, "/nvmegate.v1.Inventory/AddTarget", "target.driver", func(conn *grpc.ClientConn) error {
			_, err := pb.NewInventoryClient(conn).AddTarget(ctx, &pb.AddTargetRequest{Target: badTarget})
			return err
		}, psk[:20]},
		{sched, "/nvmegate.v1.Jobs/Get", "job_id", func(conn *grpc.ClientConn) error {
			_, err := pb.NewJobsClient(conn).Get(ctx, &pb.JobsGetRequest{JobId: `job "quoted" zq7f3c`})
			return err
		}, "zq7f3c"},
		{admin, "/nvmegate.v1.Policy/Explain", "candidate_modules", func(conn *grpc.ClientConn) error {
			_, err := pb.NewPolicyClient(conn).Explain(ctx, &pb.ExplainRequest{InputJson: []byte(`{}`),
				CandidateModules: map[string]string{`x/"` + rawKey + `.rego`: ""}})
			return err
		}, rawKey},
		{auditor, "/nvmegate.v1.Audit/Query", "nsid", func(conn *grpc.ClientConn) error {
			_, err := pb.NewAuditClient(conn).Query(ctx, &pb.QueryRequest{Nsid: 1})
			return err
		}, ""},
	}
	for _, c := range cases {
		err := c.call(g.client(t, c.who))
		wantCode(t, err, codes.InvalidArgument, c.field)
		msg := status.Convert(err).Message()
		switch {
		case nvmegate.LooksLikeKeyMaterial(c.value):
			// Key material is shown to no one, the caller included.
			if strings.Contains(msg, c.value) {
				t.Errorf("%s: the caller's answer %q shows the key it sent", c.method, msg)
			}
		case c.value != "" && !strings.Contains(msg, c.value):
			t.Errorf("%s: the caller's answer %q does not show its value", c.method, msg)
		}
	}
	if n := appends.Load(); n != int64(len(cases)) {
		t.Fatalf("%d appends for %d malformed calls", n, len(cases))
	}
	got := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{})
	if len(got) != len(cases) {
		t.Fatalf("%d entries, want %d (no deny entries)", len(got), len(cases))
	}
	for i, c := range cases {
		e := got[i]
		raw, _ := e.Encode()
		prefix := c.method + ": invalid argument: " + c.field + ": "
		if e.Kind != audit.EventInvalid || e.Caller != "spiffe://nvmegate.test"+c.who || !strings.HasPrefix(e.Detail, prefix) ||
			e.Decision != nil || e.JobID != "" || e.Tenant != "" {
			t.Errorf("entry %d: %s", i, raw)
		}
		for _, v := range []string{c.value, "DHHC", "NVMeTLSkey", rawKey[:16], "quoted"} {
			if v != "" && strings.Contains(string(raw), v) {
				t.Errorf("entry %d holds %q: %s", i, v, raw)
			}
		}
	}
	if want := `/nvmegate.v1.Access/Connect: invalid argument: job_id: looks like key material (a DH-HMAC-CHAP secret, NVMe TLS PSK or private key), which is never stored; leave the key out`; got[0].Detail != want {
		t.Errorf("detail %q, want %q", got[0].Detail, want)
	}

	// A flood: one append each, group-committed. Ten nodes send it, 20
	// calls each: one identity's calls past its share (32) would be
	// refused before validation (limit.go), and not recorded.
	before, size := appends.Load(), g.audit.Size()
	var invs []pb.InventoryClient
	for i := range 10 {
		invs = append(invs, pb.NewInventoryClient(g.client(t, fmt.Sprintf("/node/flood-%d", i))))
	}
	var wg sync.WaitGroup
	const flood = 200
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := invs[i%len(invs)].GetTarget(ctx, &pb.GetTargetRequest{Id: "NOT A LABEL"})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("flood: %v", err)
			}
		}()
	}
	wg.Wait()
	if n, grown := appends.Load()-before, g.audit.Size()-size; n != flood || grown != flood {
		t.Fatalf("%d malformed calls: %d appends, %d entries", flood, n, grown)
	}

	// No SVID: refused in the handshake, nothing recorded.
	roots := x509.NewCertPool()
	roots.AddCert(g.ca.Certificate())
	noCert, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: "ignored", InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	before = appends.Load()
	_, err = pb.NewInventoryClient(noCert).GetTarget(ctx, &pb.GetTargetRequest{Id: "NOT A LABEL"})
	wantCode(t, err, codes.Unavailable)
	if n := appends.Load() - before; n != 0 {
		t.Fatalf("%d appends for a peer without an SVID", n)
	}
}

// A refused request's values stay out of the gateway's log, as out of the
// audit log: the line says the field and the rule, not what was sent.
func TestInvalidValuesStayOutOfTheLog(t *testing.T) {
	var out logbuf.Buffer
	g := startGateway(t, func(c *gateway.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	const value = "zq7f3c-not-a-label"
	_, err := pb.NewInventoryClient(g.client(t, admin)).GetTarget(ctxT(t), &pb.GetTargetRequest{Id: "Bad " + value})
	wantCode(t, err, codes.InvalidArgument, "id", value) // the caller sees its value
	log := out.String()
	if !strings.Contains(log, "InvalidArgument") {
		t.Fatalf("no log line for the refused call:\n%s", log)
	}
	if strings.Contains(log, value) {
		t.Fatalf("the log holds the refused value:\n%s", log)
	}
}
