package gateway_test

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/policy"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// shippedPolicy is a copy of the shipped policy's files, to edit.
func shippedPolicy(t testing.TB) fstest.MapFS {
	t.Helper()
	files := fstest.MapFS{}
	if err := fs.WalkDir(policy.Default(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(policy.Default(), p)
		files[p] = &fstest.MapFile{Data: data}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return files
}

// policyWith is the shipped policy with data.json's old text replaced by
// new.
func policyWith(t *testing.T, old, new string) *policy.Bundle {
	t.Helper()
	files := shippedPolicy(t)
	data := string(files["data.json"].Data)
	if !strings.Contains(data, old) {
		t.Fatalf("policy data.json no longer has %s", old)
	}
	files["data.json"].Data = []byte(strings.Replace(data, old, new, 1))
	b, err := policy.Load(files)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const (
	// The residency of us-west data, and tightened: no longer on us-west
	// targets (the policy's self-test samples have no us-west data).
	usWest      = `"us-west":    {"target_regions": ["us-west", "us-east"]}`
	usWestMoved = `"us-west":    {"target_regions": ["us-east"]}`
	internal    = `"internal": {"max_ttl": "24h"}`
	// internal, obliging bidirectional SHA-384 DH-HMAC-CHAP with 90 s to
	// renew.
	internalTight = `"internal": {"max_ttl": "24h", "reauth_within": "90s", "auth_options": [{"auth_mode": "dhchap", "bidirectional": true, "min_dh_group": "ffdhe3072", "min_hash": "sha384"}]}`
)

// entriesOf are the log's entries of kind for grant id.
func entriesOf(t *testing.T, g *testGateway, kind audit.EventKind, id string) []audit.Entry {
	t.Helper()
	var out []audit.Entry
	p := audit.Page{}
	for {
		recs, next, err := g.audit.Query(ctxT(t), audit.Filter{Kinds: []audit.EventKind{kind}}, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Entry.GrantID == id {
				out = append(out, r.Entry)
			}
		}
		if next == "" {
			return out
		}
		p.Token = next
	}
}

// usWestGateway is admittedGateway with the target, the namespace and the
// job in us-west.
func usWestGateway(t *testing.T, opts ...gatewayOption) (*testGateway, context.Context) {
	t.Helper()
	g := startGateway(t, opts...)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	tg, ns, job := validTarget(), validNamespace(), admitRequest("job-1")
	tg.Region, ns.Region, job.AllowedRegions = "us-west", "us-west", []string{"us-west"}
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: tg}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, job); err != nil {
		t.Fatal(err)
	}
	return g, ctx
}

// A security team tightens residency: us-west data may no longer be on
// us-west targets. The grant made before is decided again under the new
// revision and revoked: one revoke entry naming the revision, the reasons
// and the change; the host is off the target; the grant reads revoked.
// Under the old revision the same re-decision changes nothing.
func TestRedecideRevokesAfterPolicyLoad(t *testing.T) {
	g, ctx := usWestGateway(t)
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	id := c.Grant.GrantId

	same, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "the same revision"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if same.Checked != 1 || len(same.Ending)+len(same.Tightening) != 0 {
		t.Fatalf("under the revision that granted it: %+v", same)
	}

	if err := g.engine.Reload(ctx, policyWith(t, usWest, usWestMoved), "residency-tightened"); err != nil {
		t.Fatal(err)
	}
	rev := g.engine.Status().Revision
	d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "policy revision X loaded"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if d.Checked != 1 || len(d.Ending) != 1 || len(d.Done.Revoked) != 1 || d.Done.Revoked[0] != id || d.PolicyRevision != rev {
		t.Fatalf("re-decision %+v", d)
	}
	gr, err := g.lease.Grant(ctx, id)
	if err != nil || gr.State != nvmegate.GrantRevoked {
		t.Fatalf("grant after: %+v, %v", gr, err)
	}
	if hs := hostsOn(t, g); len(hs) != 0 {
		t.Fatalf("hosts on the target after the revocation: %v", hs)
	}
	es := entriesOf(t, g, audit.EventRevoke, id)
	if len(es) != 1 {
		t.Fatalf("revoke entries: %d", len(es))
	}
	e := es[0]
	if e.Decision == nil || e.Decision.Allow || e.Decision.PolicyRevision != rev || len(e.Decision.Reasons) == 0 ||
		!strings.Contains(e.Detail, "policy revision X loaded") || !strings.Contains(e.Detail, "data revision") ||
		e.Caller != "spiffe://nvmegate.test/gateway/test" {
		t.Fatalf("revoke entry %+v (decision %+v)", e, e.Decision)
	}
	// The node's next connect is refused by the same revision.
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err == nil {
		t.Fatal("connect allowed after the residency change")
	}
}

// A dry run (a policy impact) reports what a candidate would end and
// changes nothing.
func TestRedecideDryRunChangesNothing(t *testing.T) {
	g, ctx := usWestGateway(t)
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	size := g.audit.Size()
	if err := g.engine.Reload(ctx, policyWith(t, usWest, usWestMoved), "residency-tightened"); err != nil {
		t.Fatal(err)
	}
	d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "impact"}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ending) != 1 || d.Ending[0].Grant.ID != c.Grant.GrantId || len(d.Done.Revoked) != 0 {
		t.Fatalf("dry run %+v", d)
	}
	if gr, err := g.lease.Grant(ctx, c.Grant.GrantId); err != nil || gr.State != nvmegate.GrantActive {
		t.Fatalf("grant after a dry run: %+v, %v", gr, err)
	}
	if g.audit.Size() != size {
		t.Fatalf("a dry run wrote %d entries", g.audit.Size()-size)
	}
}

// A class now obliges stronger authentication: the grant is still allowed
// but was issued under weaker obligations. It is recorded (reauth_required)
// and must renew within the class's reauth_within; a renewal meets the new
// obligations and clears the deadline; a grant that does not renew is
// revoked by the sweep once the deadline passes, naming the change.
func TestRedecideTightenedMustRenew(t *testing.T) {
	var now time.Time
	clock := func() time.Time {
		if now.IsZero() {
			return time.Now()
		}
		return now
	}
	g, ctx := admittedGateway(t, func(c *gateway.Config) { c.Now = clock })
	n1 := pb.NewAccessClient(g.client(t, node))
	c1, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2")).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.engine.Reload(ctx, policyWith(t, internal, internalTight), "internal-tightened"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "class internal tightened"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Ending) != 0 || len(d.Tightening) != 2 || len(d.Done.Marked) != 2 {
		t.Fatalf("re-decision %+v", d)
	}
	for _, id := range []string{c1.Grant.GrantId, c2.Grant.GrantId} {
		gr, err := g.lease.Grant(ctx, id)
		if err != nil || gr.State != nvmegate.GrantActive || gr.ReauthBy.Before(start.Add(80*time.Second)) || gr.ReauthBy.After(time.Now().Add(90*time.Second)) ||
			!strings.Contains(gr.ReauthWhy, "class internal tightened") {
			t.Fatalf("grant %s after: %+v, %v", id, gr, err)
		}
		es := entriesOf(t, g, audit.EventReauth, id)
		if len(es) != 1 || es[0].Decision == nil || !es[0].Decision.Allow || !strings.Contains(es[0].Detail, "bidirectional") {
			t.Fatalf("reauth entries of %s: %+v", id, es)
		}
	}
	// Node 1 renews: the new obligations, no deadline.
	r1, err := n1.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Credentials.DhchapCtrlSecret == "" {
		t.Fatal("the renewal is not bidirectional")
	}
	if gr, err := g.lease.Grant(ctx, c1.Grant.GrantId); err != nil || !gr.ReauthBy.IsZero() || gr.ReauthWhy != "" {
		t.Fatalf("renewed grant: %+v, %v", gr, err)
	}
	// A second re-decision finds nothing more to do.
	if again, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "again"}, nil, false); err != nil ||
		len(again.Tightening) != 1 || len(again.Done.Marked) != 0 {
		t.Fatalf("again: %+v, %v (the unrenewed grant keeps its first deadline)", again, err)
	}
	// Past the deadline, the sweep revokes node 2's grant and leaves node 1's.
	now = time.Now().Add(2 * time.Minute)
	n, err := g.lease.Expire(ctx)
	if err != nil || n != 1 {
		t.Fatalf("sweep: %d, %v", n, err)
	}
	if gr, _ := g.lease.Grant(ctx, c2.Grant.GrantId); gr.State != nvmegate.GrantRevoked {
		t.Fatalf("unrenewed grant: %s", gr.State)
	}
	if gr, _ := g.lease.Grant(ctx, c1.Grant.GrantId); gr.State != nvmegate.GrantActive {
		t.Fatalf("renewed grant: %s", gr.State)
	}
	es := entriesOf(t, g, audit.EventRevoke, c2.Grant.GrantId)
	if len(es) != 1 || !strings.Contains(es[0].Detail, "not renewed by") || !strings.Contains(es[0].Detail, "class internal tightened") {
		t.Fatalf("revoke entry: %+v", es)
	}
}

// Records change: the job's namespace is removed from the inventory; the
// change feed names its subsystem, and the re-decision of the grants on it
// revokes the grant. A change to another subsystem re-decides nothing.
func TestRedecideAfterInventoryChange(t *testing.T) {
	g, ctx := admittedGateway(t)
	feed := g.db.WatchScope()
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	other, err := g.srv.Redecide(ctx, gateway.Change{Subsystems: []string{"nqn.2026-01.io.nvmegate.test:other"}, Cause: "other"}, nil, false)
	if err != nil || other.Checked != 0 {
		t.Fatalf("a change elsewhere re-decided %+v (%v)", other, err)
	}
	if _, err := pb.NewInventoryClient(g.client(t, admin)).RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ch, err := feed.Next(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Subsystems) != 1 || ch.Subsystems[0] != subNQN || ch.Revision != g.db.ScopeRevision() {
		t.Fatalf("change %+v", ch)
	}
	d, err := g.srv.Redecide(ctx, gateway.Change{Subsystems: ch.Subsystems, Cause: "namespace moved"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if d.Checked != 1 || len(d.Done.Revoked) != 1 || d.Done.Revoked[0] != c.Grant.GrantId || d.DataRevision != ch.Revision {
		t.Fatalf("re-decision %+v", d)
	}
}

// A re-decision waits for the connects that began before it: one in
// flight when the change lands is decided again once it is granted.
func TestRedecideWaitsForConnectsInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{})
	g, ctx := usWestGateway(t, func(c *gateway.Config) {
		c.Targets = &stalling{TargetProgrammer: c.Targets, entered: entered, release: release}
	})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // a failing test does not leave the connect hanging
	done := make(chan error, 1)
	var granted string
	go func() {
		c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
		if err == nil {
			granted = c.Grant.GrantId
		}
		done <- err
	}()
	<-entered // decided under the old revision, being programmed
	if err := g.engine.Reload(ctx, policyWith(t, usWest, usWestMoved), "residency-tightened"); err != nil {
		t.Fatal(err)
	}
	res := make(chan *gateway.Redecision, 1)
	go func() {
		d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "policy"}, nil, false)
		if err != nil {
			t.Error(err)
		}
		res <- d
	}()
	select {
	case d := <-res:
		t.Fatalf("re-decided before the connect in flight ended: %+v", d)
	case <-time.After(200 * time.Millisecond):
	}
	unblock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	d := <-res
	if d == nil || len(d.Done.Revoked) != 1 || d.Done.Revoked[0] != granted {
		t.Fatalf("re-decision %+v, want the grant made in flight revoked", d)
	}
}

// stalling holds the first Program call until release is closed.
type stalling struct {
	gateway.TargetProgrammer
	entered chan struct{}
	release chan struct{}
}

func (s *stalling) Program(ctx context.Context, targetID string, changed ...nvmegate.HostRef) error {
	select {
	case s.entered <- struct{}{}:
		<-s.release
	default:
	}
	return s.TargetProgrammer.Program(ctx, targetID, changed...)
}

// candidateFiles are the shipped policy's files with data.json's old
// replaced by new, as `nvmegate policy impact` sends them.
func candidateFiles(t *testing.T, old, new string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for p, f := range shippedPolicy(t) {
		if !strings.HasSuffix(p, "_test.rego") {
			files[p] = f.Data
		}
	}
	files["data.json"] = []byte(strings.Replace(string(files["data.json"]), old, new, 1))
	return files
}

// Policy.Impact lists the grants a candidate would revoke, and why,
// without loading it or changing anything; only a policy admin may ask;
// a candidate that does not load or fails its self-test is refused as
// invalid, naming why.
func TestPolicyImpact(t *testing.T) {
	g, ctx := usWestGateway(t)
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	serving := g.engine.Status().Revision
	size := g.audit.Size()
	pc := pb.NewPolicyClient(g.client(t, admin))
	resp, err := pc.Impact(ctx, &pb.ImpactRequest{CandidateFiles: candidateFiles(t, usWest, usWestMoved)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Checked != 1 || len(resp.Grants) != 1 || resp.ServingRevision != serving || resp.CandidateRevision == serving ||
		len(resp.Jobs) != 1 || resp.Jobs[0] != "job-1" {
		t.Fatalf("impact %v", resp)
	}
	ig := resp.Grants[0]
	if ig.GrantId != c.Grant.GrantId || ig.Outcome != "revoke" || len(ig.Reasons) == 0 || !strings.Contains(ig.Reasons[0], "region us-west") {
		t.Fatalf("impacted grant %v", ig)
	}
	// Nothing changed: the serving revision, the grant, the log.
	if g.engine.Status().Revision != serving {
		t.Fatal("the candidate was loaded")
	}
	if gr, err := g.lease.Grant(ctx, c.Grant.GrantId); err != nil || gr.State != nvmegate.GrantActive {
		t.Fatalf("grant after the impact: %+v %v", gr, err)
	}
	if g.audit.Size() != size {
		// The impact call itself is not a change: nothing is appended.
		t.Fatalf("the impact wrote %d entries", g.audit.Size()-size)
	}
	// The same policy: no impact.
	if same, err := pc.Impact(ctx, &pb.ImpactRequest{CandidateFiles: candidateFiles(t, usWest, usWest)}); err != nil || len(same.Grants) != 0 || same.Checked != 1 {
		t.Fatalf("unchanged candidate: %v %v", same, err)
	}
	// Only a policy admin.
	for _, who := range []string{node, sched, auditor, "/target/stor-eu-1"} {
		_, err := pb.NewPolicyClient(g.client(t, who)).Impact(ctx, &pb.ImpactRequest{CandidateFiles: candidateFiles(t, usWest, usWestMoved)})
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", who, err)
		}
	}
	// Bad candidates.
	broken := candidateFiles(t, usWest, usWest)
	broken["authz.rego"] = []byte("package nvmegate.authz\n\ndecision := {")
	selftest := candidateFiles(t, `"eu-west":    {"target_regions": ["eu-west", "eu-central"]}`, `"eu-west":    {"target_regions": ["eu-central"]}`)
	for name, files := range map[string]map[string][]byte{
		"none":      {},
		"dot-dot":   {"../data.json": []byte("{}")},
		"broken":    broken,
		"self-test": selftest,
	} {
		_, err := pc.Impact(ctx, &pb.ImpactRequest{CandidateFiles: files})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "candidate_files") {
			t.Errorf("%s: %v, want InvalidArgument about candidate_files", name, err)
		}
		if name == "self-test" && err != nil && !strings.Contains(err.Error(), "self-test sample") {
			t.Errorf("self-test: %v does not name the sample", err)
		}
	}
}

// A verdict acts only on the grant as it was decided: one released (or
// renewed) meanwhile is not revoked, and nothing is recorded for it.
func TestReconsiderSkipsGrantsChangedMeanwhile(t *testing.T) {
	g, ctx := admittedGateway(t)
	ac := pb.NewAccessClient(g.client(t, node))
	c, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	gr, err := g.lease.Grant(ctx, c.Grant.GrantId)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Release(ctx, &pb.ReleaseRequest{GrantId: gr.ID}); err != nil {
		t.Fatal(err)
	}
	deny := &nvmegate.Decision{ID: "d-test", PolicyRevision: "r-test", Reasons: []string{"test"}}
	done, err := g.lease.Reconsider(ctx, []lease.Verdict{{Grant: gr, Decision: deny}}, "a test change", 1, "spiffe://nvmegate.test/gateway/test")
	if err != nil || len(done.Revoked) != 0 {
		t.Fatalf("reconsidered a released grant: %+v, %v", done, err)
	}
	if after, _ := g.lease.Grant(ctx, gr.ID); after.State != nvmegate.GrantReleased {
		t.Fatalf("released grant now %s", after.State)
	}
	if es := entriesOf(t, g, audit.EventRevoke, gr.ID); len(es) != 0 {
		t.Fatalf("revoke entries for a released grant: %+v", es)
	}
}

// A panic while deciding (a candidate's evaluation, an authorizer's bug)
// is the re-decision's error; the gateway keeps serving. An authorizer
// that returns no decision does not allow.
func TestRedecideSurvivesAuthorizerFaults(t *testing.T) {
	g, ctx := admittedGateway(t)
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	panicking := authz.AuthorizerFunc(func(context.Context, *authz.Input) (*nvmegate.Decision, error) { panic("evaluator bug") })
	if _, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "test"}, panicking, true); err == nil || !strings.Contains(err.Error(), "panic") {
		t.Fatalf("a panicking authorizer: %v", err)
	}
	none := authz.AuthorizerFunc(func(context.Context, *authz.Input) (*nvmegate.Decision, error) { return nil, nil })
	d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "test"}, none, true)
	if err != nil || len(d.Ending) != 1 {
		t.Fatalf("an authorizer with no decision: %+v, %v", d, err)
	}
	if _, err := healthpb.NewHealthClient(g.client(t, node)).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the gateway after the faults: %v", err)
	}
}
