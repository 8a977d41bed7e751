package gateway_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// A node of an active job discovers the job's subsystem ports and the host
// NQN it must use; nodes outside the job, of another tenant, or after the
// job finished learn nothing.
func TestDiscover(t *testing.T) {
	g, ctx := admittedGateway(t)
	// acme-gpu-2 has an explicit binding; acme-gpu-1 uses its derived NQN.
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test/node/acme-gpu-2", HostNqn: hostNQN, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	derived, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test" + node)
	if err != nil {
		t.Fatal(err)
	}
	for who, wantNQN := range map[string]string{node: derived, "/node/acme-gpu-2": hostNQN} {
		d, err := pb.NewAccessClient(g.client(t, who)).Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		if d.HostNqn != wantNQN || len(d.Entries) != 2 {
			t.Fatalf("%s: %v", who, d)
		}
		e0, e1 := d.Entries[0], d.Entries[1]
		if e0.Subnqn != subNQN || e0.Trtype != "tcp" || e0.Traddr != "10.0.0.10" || e0.Trsvcid != "4420" || e0.Sectype != "none" ||
			e0.Treq != "not required" || e1.Trsvcid != "4421" || e1.Sectype != "tls1.3" || e1.Treq != "required" {
			t.Fatalf("%s: entries %v", who, d.Entries)
		}
	}
	for _, who := range []string{"/node/acme-gpu-3", "/node/globex-gpu-1", sched, admin} {
		_, err := pb.NewAccessClient(g.client(t, who)).Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"})
		wantCode(t, err, codes.PermissionDenied)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Discover(ctx, &pb.DiscoverRequest{JobId: "no-such-job"})
	wantCode(t, err, codes.PermissionDenied)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1"}); err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"})
	wantCode(t, err, codes.PermissionDenied, "not active")
}

// A node whose derived default host NQN an explicit binding gave to another
// identity is refused rather than handed that identity's NQN.
func TestDiscoverDerivedNQNTaken(t *testing.T) {
	g, ctx := admittedGateway(t)
	derived, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test" + node)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test/node/acme-gpu-2", HostNqn: derived, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"})
	wantCode(t, err, codes.FailedPrecondition, "bound to another identity")
}

// The main path: a node of an active job connects; it gets DH-HMAC-CHAP
// secrets for its bound host NQN, and only after the target (the nvmet
// tree) allows exactly that host with exactly those keys and the grant is
// in the audit log — with fingerprints, never the secrets.
func TestConnect(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test" + node, HostNqn: hostNQN, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	resp, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	gr, c := resp.Grant, resp.Credentials
	if gr.HostNqn != hostNQN || gr.SubsystemNqn != subNQN || gr.State != pb.GrantState_GRANT_STATE_ACTIVE || gr.KeyVersion != 1 ||
		gr.AuditIndex == 0 || gr.DecisionId != resp.Decision.Id || !resp.Decision.Allow {
		t.Fatalf("grant %v", gr)
	}
	if _, err := nvmefmt.ParseDHCHAP(c.DhchapHostSecret); err != nil {
		t.Fatalf("host secret: %v", err)
	}
	// The grant's lifetime is capped by the policy's max TTL or the default.
	if life := gr.ExpiresAt.AsTime().Sub(gr.IssuedAt.AsTime()); life <= 0 || life > time.Hour {
		t.Fatalf("grant lifetime %v", life)
	}
	// The target allows the host with those keys.
	hostDir := filepath.Join(g.configfs, "stor-eu-1", "hosts", hostNQN)
	key, err := os.ReadFile(filepath.Join(hostDir, "dhchap_key"))
	if err != nil || strings.TrimSpace(string(key)) != c.DhchapHostSecret {
		t.Fatalf("target host key %q (%v)", key, err)
	}
	if _, err := os.Readlink(filepath.Join(g.configfs, "stor-eu-1", "subsystems", subNQN, "allowed_hosts", hostNQN)); err != nil {
		t.Fatalf("allowed_hosts link: %v", err)
	}
	// config.json and nvme connect arguments name the same.
	if !strings.Contains(string(resp.ConfigJson), hostNQN) || !strings.Contains(string(resp.ConfigJson), c.DhchapHostSecret) ||
		!slices.Contains(resp.ConnectArgs, "--dhchap-secret="+c.DhchapHostSecret) && !slices.Contains(resp.ConnectArgs, c.DhchapHostSecret) {
		t.Fatalf("config %s\nargs %v", resp.ConfigJson, resp.ConnectArgs)
	}
	// The audit entry: the grant, its fingerprints, no secret.
	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"grant"}})
	if len(entries) != 1 {
		t.Fatalf("%d grant entries", len(entries))
	}
	e := entries[0]
	if e.GrantID != gr.GrantId || e.HostNQN != hostNQN || e.JobID != "job-1" || len(e.Keys) < 2 || e.Keys[0].Version != 1 ||
		!strings.HasPrefix(e.Keys[1].Fingerprint, "hmac-sha256:") || e.ExpiresAt.IsZero() {
		t.Fatalf("grant entry %+v", e)
	}
	raw, _ := e.Encode()
	if strings.Contains(string(raw), "DHHC-1") {
		t.Fatal("the audit entry holds a secret")
	}

	// Outside the scope: another tenant's node, a subsystem the job does
	// not name, a node not in the job.
	for who, sub := range map[string]string{"/node/globex-gpu-1": subNQN, "/node/acme-gpu-3": subNQN} {
		_, err := pb.NewAccessClient(g.client(t, who)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
		wantCode(t, err, codes.PermissionDenied)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN + "-other"})
	wantCode(t, err, codes.PermissionDenied)
	// A node may not ask for a host NQN that is not its own.
	_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN,
		HostNqn: "nqn.2014-08.org.nvmexpress:uuid:99999999-aaaa-4000-8000-000000000000"})
	wantCode(t, err, codes.PermissionDenied)

	// Each refusal is a deny entry with the records policy saw, though
	// policy saw them typed and no map was built for the call
	// (authz.Input.ResourceMap builds it for the entry).
	denies := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"deny"}})
	if len(denies) != 4 {
		t.Fatalf("%d deny entries, want 4", len(denies))
	}
	outsider, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test/node/acme-gpu-3")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range denies {
		if e.JobID != "job-1" || e.Tenant != "acme" || e.Detail != "access.connect job-1" || e.ExpiresAt.IsZero() ||
			e.Decision == nil || e.Decision.Allow || len(e.Decision.Reasons) == 0 {
			t.Errorf("deny entry %+v", e)
		}
		if e.Caller == "spiffe://nvmegate.test/node/acme-gpu-3" {
			found = true
			if e.SubsystemNQN != subNQN || e.HostNQN != outsider || len(e.Namespaces) != 1 ||
				e.Namespaces[0].NSID != 1 || e.Namespaces[0].Mode != nvmegate.ModeReadOnly || e.Namespaces[0].Dataset == "" {
				t.Errorf("deny entry of a node not in the job %+v", e)
			}
		}
	}
	if !found {
		t.Error("no deny entry of the node not in the job")
	}
}

// hostsOn lists the hosts a target's nvmet tree allows on the subsystem.
func hostsOn(t *testing.T, g *testGateway) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(g.configfs, "stor-eu-1", "subsystems", subNQN, "allowed_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// A grant's life: renew after a rotation returns the new root's secret and
// the target has it before the answer; release and revoke remove the host
// from the target; finishing the job ends the rest and rotates the root.
func TestGrantLifecycle(t *testing.T) {
	g, ctx := admittedGateway(t)
	n1, n2 := pb.NewAccessClient(g.client(t, node)), pb.NewAccessClient(g.client(t, "/node/acme-gpu-2"))
	c1, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := n2.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if hs := hostsOn(t, g); len(hs) != 2 {
		t.Fatalf("hosts after two connects: %v", hs)
	}
	// Rotate, renew: the new version's secret, on the target already.
	if _, err := pb.NewKeysClient(g.client(t, admin)).Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	r1, err := n1.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Grant.KeyVersion != 2 || r1.Credentials.DhchapHostSecret == c1.Credentials.DhchapHostSecret {
		t.Fatalf("renew after rotation: v%d", r1.Grant.KeyVersion)
	}
	key, _ := os.ReadFile(filepath.Join(g.configfs, "stor-eu-1", "hosts", c1.Grant.HostNqn, "dhchap_key"))
	if strings.TrimSpace(string(key)) != r1.Credentials.DhchapHostSecret {
		t.Fatal("the target does not have the renewed secret")
	}
	// Another node cannot renew or release someone else's grant
	// (TestOthersGrantRevealsNothing).
	_, err = n2.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	wantCode(t, err, codes.NotFound)
	_, err = n2.Release(ctx, &pb.ReleaseRequest{GrantId: c1.Grant.GrantId})
	wantCode(t, err, codes.NotFound)

	// Release: the host leaves the target.
	if _, err := n1.Release(ctx, &pb.ReleaseRequest{GrantId: c1.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	if hs := hostsOn(t, g); len(hs) != 1 || hs[0] != c2.Grant.HostNqn {
		t.Fatalf("hosts after release: %v", hs)
	}
	_, err = n1.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	wantCode(t, err, codes.FailedPrecondition, "no longer active")

	// Finishing the job ends the other grant and rotates the root.
	fin, err := pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	if err != nil || len(fin.EndedGrantIds) != 1 || fin.EndedGrantIds[0] != c2.Grant.GrantId {
		t.Fatalf("finish: %v %v", fin, err)
	}
	if hs := hostsOn(t, g); len(hs) != 0 {
		t.Fatalf("hosts after finish: %v", hs)
	}
	st, err := pb.NewKeysClient(g.client(t, admin)).Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT})
	if err != nil || st.Keys[0].CurrentVersion != 3 {
		t.Fatalf("root after finish: %v %v", st, err)
	}
	list, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1"})
	if err != nil || len(list.Grants) != 2 {
		t.Fatalf("grants: %v %v", list, err)
	}
	states := map[pb.GrantState]int{}
	for _, gr := range list.Grants {
		states[gr.State]++
	}
	if states[pb.GrantState_GRANT_STATE_RELEASED] != 1 || states[pb.GrantState_GRANT_STATE_REVOKED] != 1 {
		t.Fatalf("grant states %v", states)
	}
}

// An admin revokes a node's grants: the hosts leave the targets.
func TestRevokeByNode(t *testing.T) {
	g, ctx := admittedGateway(t)
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	_, err := pb.NewAccessClient(g.client(t, sched)).Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_Node{Node: "spiffe://nvmegate.test" + node}, Reason: "x"})
	wantCode(t, err, codes.PermissionDenied)
	rv, err := pb.NewAccessClient(g.client(t, admin)).Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_Node{Node: "spiffe://nvmegate.test" + node}, Reason: "compromised"})
	if err != nil || len(rv.RevokedGrantIds) != 1 {
		t.Fatalf("revoke: %v %v", rv, err)
	}
	if hs := hostsOn(t, g); len(hs) != 0 {
		t.Fatalf("hosts after revoke: %v", hs)
	}
	// The call's entry, then one per revoked grant with its job and host.
	got := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"revoke"}})
	if len(got) != 2 || got[0].Caller != "spiffe://nvmegate.test"+admin || got[0].GrantID != "" {
		t.Fatalf("revoke entries %+v", got)
	}
	if e := got[1]; e.GrantID != rv.RevokedGrantIds[0] || e.JobID != "job-1" || e.HostNQN == "" || e.SubsystemNQN != subNQN ||
		e.Caller != "spiffe://nvmegate.test"+admin || e.Detail != "revoked: compromised" {
		t.Fatalf("the grant's revoke entry %+v", e)
	}
}

// A node granted two subsystems of the same nvmet target (a dataset and a
// checkpoint subsystem on one storage server, say) gets the same
// DH-HMAC-CHAP secret for both: nvmet keys a host once per target, so the
// secrets derive per (host, target) there.
func TestConnectTwoSubsystemsOneNVMetTarget(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	sub2 := subNQN + "-ckpt"
	addSecondSubsystem(t, g, sub2, "internal")
	ac := pb.NewAccessClient(g.client(t, node))
	c1, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub2})
	if err != nil {
		t.Fatalf("second subsystem on the same target: %v", err)
	}
	if c1.Credentials.DhchapHostSecret != c2.Credentials.DhchapHostSecret {
		t.Fatal("two secrets for one host on one nvmet target")
	}
	for _, s := range []string{subNQN, sub2} {
		if _, err := os.Readlink(filepath.Join(g.configfs, "stor-eu-1", "subsystems", s, "allowed_hosts", c1.Grant.HostNqn)); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}

	// The target's root rotates and the node renews one of the two grants:
	// the host's entry must still be one entry, and the target must keep
	// taking other hosts.
	if _, err := pb.NewKeysClient(g.client(t, admin)).Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	r1, err := ac.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	if err != nil {
		t.Fatalf("renew one of two grants on the target: %v", err)
	}
	if r1.Credentials.DhchapHostSecret == c1.Credentials.DhchapHostSecret {
		t.Fatal("renew after the rotation kept the old secret")
	}
	if _, err := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2")).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatalf("another node after the renewal: %v", err)
	}
	key, _ := os.ReadFile(filepath.Join(g.configfs, "stor-eu-1", "hosts", c1.Grant.HostNqn, "dhchap_key"))
	if strings.TrimSpace(string(key)) != r1.Credentials.DhchapHostSecret {
		t.Fatal("the host's entry does not hold the renewed secret")
	}
	// The other grant moved with it, and the renewal's entry says so.
	list, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1", State: pb.GrantState_GRANT_STATE_ACTIVE})
	if err != nil {
		t.Fatal(err)
	}
	for _, gr := range list.Grants {
		if gr.GrantId == c2.Grant.GrantId && gr.KeyVersion != r1.Grant.KeyVersion {
			t.Fatalf("the grant sharing the host entry is at v%d, the renewed one at v%d", gr.KeyVersion, r1.Grant.KeyVersion)
		}
	}
	renews := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"renew"}})
	if len(renews) != 1 || !strings.Contains(renews[0].Detail, "moves "+c2.Grant.GrantId) {
		t.Fatalf("renew entries %+v", renews)
	}
}

// The sweeper ends expired grants: recorded as expire, stored as expired,
// and the host leaves the target.
func TestSweepExpired(t *testing.T) {
	g, ctx := admittedGateway(t)
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN, Ttl: durationpb.New(time.Nanosecond)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := g.srv.SweepExpired(ctx)
	if err != nil || n != 1 {
		t.Fatalf("swept %d (%v), want 1", n, err)
	}
	if hs := hostsOn(t, g); len(hs) != 0 {
		t.Fatalf("hosts after expiry: %v", hs)
	}
	if n, err := g.srv.SweepExpired(ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
	got := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"expire"}})
	if len(got) != 1 || got[0].GrantID != c.Grant.GrantId || got[0].JobID != "job-1" {
		t.Fatalf("expire entries %+v", got)
	}
	list, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1", State: pb.GrantState_GRANT_STATE_EXPIRED})
	if err != nil || len(list.Grants) != 1 {
		t.Fatalf("expired grants: %v %v", list, err)
	}
}

// A restricted dataset on a subsystem with a TLS port: the policy's
// obligations ask for TLS, and the grant carries the configured PSK in the
// interchange format with its v1 PSK identity, and only the TLS port. On an
// SPDK target (programmed here by a remote agent that records what it is
// given); an nvmet target, whose driver cannot install PSKs, refuses.
func TestConnectTLS(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	spdkTarget := validTarget()
	spdkTarget.Driver = "spdk"
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: spdkTarget}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: subNQN, TargetId: "stor-eu-1", Tenant: "acme",
		PortIds: []uint32{1, 2}, Tls: true}}); err != nil {
		t.Fatal(err)
	}
	rec := &recordingDriver{}
	waitApplied(t, startRemote(t, g, "stor-eu-1", rec))
	ns := validNamespace()
	ns.DataClass = "restricted"
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Decision.Obligations.RequireTls || !strings.HasPrefix(c.Credentials.TlsPsk, "NVMeTLSkey-1:") ||
		!strings.HasPrefix(c.Credentials.TlsPskIdentity, "NVMe1R0") || !strings.Contains(c.Credentials.TlsPskIdentity, c.Grant.HostNqn+" "+subNQN+" ") {
		t.Fatalf("obligations %v, psk given %v, identity %q", c.Decision.Obligations, c.Credentials.TlsPsk != "", c.Credentials.TlsPskIdentity)
	}
	if len(c.ConnectArgs) == 0 || !slices.Contains(c.ConnectArgs, "--trsvcid=4421") || slices.Contains(c.ConnectArgs, "--trsvcid=4420") {
		t.Fatalf("connect args %v: want the TLS port only", c.ConnectArgs)
	}
	// The subsystem does not do DH-HMAC-CHAP: no secret for it.
	if c.Credentials.DhchapHostSecret != "" || c.Credentials.DhchapCtrlSecret != "" {
		t.Fatal("DH-HMAC-CHAP secrets for a TLS-only subsystem")
	}
	// The target got the host with its PSK, and nothing else.
	if h := rec.host(c.Grant.HostNqn); h == nil || h.TLSPSK != c.Credentials.TlsPsk || h.DHCHAPKey != "" {
		t.Fatalf("target host %v", h)
	}
}

// recordingDriver accepts every state and keeps the last, and every
// whole state it was given (namespaces and subsystems change only in
// those; a delta changes hosts).
type recordingDriver struct {
	mu    sync.Mutex
	last  fabric.State
	whole []fabric.State
}

func (r *recordingDriver) Apply(_ context.Context, s fabric.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = s
	r.whole = append(r.whole, s)
	return nil
}

func (r *recordingDriver) ApplyDelta(_ context.Context, d fabric.Delta) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last.ApplyDelta(d)
}

func (r *recordingDriver) host(nqn string) *fabric.Host {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, sub := range r.last.Subsystems {
		for _, h := range sub.Hosts {
			if h.NQN == nqn {
				return &h
			}
		}
	}
	return nil
}

// On an nvmet target a TLS grant carries DH-HMAC-CHAP too: nvmet does not
// bind a TLS PSK to the host NQN of the Connect command, so DH-HMAC-CHAP
// inside the session authenticates the host. The shipped policy asks for
// auth_mode both there; the target gets the host's PSK and its DH-HMAC-CHAP
// key. A TLS subsystem without DH-HMAC-CHAP on nvmet is refused, and no
// host reaches the target.
func TestConnectTLSOnNVMet(t *testing.T) {
	for _, dhchap := range []bool{true, false} {
		t.Run(fmt.Sprint("dhchap=", dhchap), func(t *testing.T) {
			g := startGateway(t)
			inv := pb.NewInventoryClient(g.client(t, admin))
			ctx := ctxT(t)
			if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
				t.Fatal(err)
			}
			if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: subNQN, TargetId: "stor-eu-1", Tenant: "acme",
				PortIds: []uint32{1, 2}, Tls: true, Dhchap: dhchap}}); err != nil {
				t.Fatal(err)
			}
			rec := &recordingDriver{}
			waitApplied(t, startRemote(t, g, "stor-eu-1", rec))
			ns := validNamespace()
			ns.DataClass = "restricted"
			if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
				t.Fatal(err)
			}
			if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
				t.Fatal(err)
			}
			c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
			if !dhchap {
				wantCode(t, err, codes.FailedPrecondition, "does not do DH-HMAC-CHAP")
				rec.mu.Lock()
				defer rec.mu.Unlock()
				for _, sub := range rec.last.Subsystems {
					if len(sub.Hosts) != 0 {
						t.Fatalf("hosts reached the target: %v", sub.Hosts)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Decision.Obligations.AuthMode != "both" || !strings.HasPrefix(c.Credentials.TlsPsk, "NVMeTLSkey-1:") ||
				!strings.HasPrefix(c.Credentials.DhchapHostSecret, "DHHC-1:") {
				t.Fatalf("auth_mode %q, psk given %v, dhchap given %v", c.Decision.Obligations.AuthMode, c.Credentials.TlsPsk != "", c.Credentials.DhchapHostSecret != "")
			}
			if !slices.Contains(c.ConnectArgs, "--tls") || !slices.ContainsFunc(c.ConnectArgs, func(a string) bool { return strings.HasPrefix(a, "--dhchap-secret=") }) {
				t.Fatalf("connect args carry TLS and DH-HMAC-CHAP: %d args", len(c.ConnectArgs))
			}
			if h := rec.host(c.Grant.HostNqn); h == nil || h.TLSPSK != c.Credentials.TlsPsk || h.DHCHAPKey != c.Credentials.DhchapHostSecret {
				t.Fatalf("the target's host entry lacks the PSK or the DH-HMAC-CHAP key")
			}
		})
	}
}

// The security team tightens a class while grants are active: a renewal is
// a new decision, and its obligations reach the grant, the credentials and
// the target (here: SHA-384, ffdhe3072 and bidirectional authentication
// for the internal class, which had none).
func TestRenewAppliesNewObligations(t *testing.T) {
	g, ctx := admittedGateway(t)
	n1 := pb.NewAccessClient(g.client(t, node))
	c1, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if c1.Credentials.DhchapCtrlSecret != "" || !strings.HasPrefix(c1.Credentials.DhchapHostSecret, "DHHC-1:01:") {
		t.Fatalf("before: host secret %.10s…, ctrl secret set: %v", c1.Credentials.DhchapHostSecret, c1.Credentials.DhchapCtrlSecret != "")
	}

	// The new policy data: internal now obliges what restricted's
	// DH-HMAC-CHAP option does.
	b := policyWith(t, `"internal": {"max_ttl": "24h"}`,
		`"internal": {"max_ttl": "24h", "auth_options": [{"auth_mode": "dhchap", "bidirectional": true, "min_dh_group": "ffdhe3072", "min_hash": "sha384"}]}`)
	if err := g.engine.Reload(ctx, b, "tightened"); err != nil {
		t.Fatal(err)
	}

	r1, err := n1.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r1.Credentials.DhchapHostSecret, "DHHC-1:02:") || !strings.HasPrefix(r1.Credentials.DhchapCtrlSecret, "DHHC-1:02:") {
		t.Fatalf("after: host secret %.10s…, ctrl secret %.10s…; want SHA-384 secrets both ways", r1.Credentials.DhchapHostSecret, r1.Credentials.DhchapCtrlSecret)
	}
	host := filepath.Join(g.configfs, "stor-eu-1", "hosts", c1.Grant.HostNqn)
	for name, want := range map[string]string{
		"dhchap_key":      r1.Credentials.DhchapHostSecret,
		"dhchap_ctrl_key": r1.Credentials.DhchapCtrlSecret,
		"dhchap_hash":     "hmac(sha384)",
		"dhchap_dhgroup":  "ffdhe3072",
	} {
		got, _ := os.ReadFile(filepath.Join(host, name))
		if strings.TrimSpace(string(got)) != want {
			t.Errorf("the target's %s is not what the renewal obliges", name)
		}
	}
}

// A node granted a subsystem of an nvmet target (internal data: SHA-256,
// unidirectional) connects to another subsystem of that target whose
// restricted data obliges SHA-384, ffdhe3072 and bidirectional
// authentication. The target holds one entry per host, so both grants take
// the stronger authentication (obligations are minimums), the first moving
// with the second, named in its audit entry.
func TestConnectStrongestAuthOneNVMetTarget(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	sub2 := subNQN + "-restricted"
	addSecondSubsystem(t, g, sub2, "restricted")
	ac := pb.NewAccessClient(g.client(t, node))
	c1, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c1.Credentials.DhchapHostSecret, "DHHC-1:01:") || c1.Credentials.DhchapCtrlSecret != "" {
		t.Fatal("the internal grant is not SHA-256 unidirectional")
	}
	c2, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub2})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c2.Credentials.DhchapHostSecret, "DHHC-1:02:") || !strings.HasPrefix(c2.Credentials.DhchapCtrlSecret, "DHHC-1:02:") {
		t.Fatal("the restricted grant is not SHA-384 bidirectional")
	}
	host := filepath.Join(g.configfs, "stor-eu-1", "hosts", c1.Grant.HostNqn)
	for name, want := range map[string]string{"dhchap_key": c2.Credentials.DhchapHostSecret, "dhchap_hash": "hmac(sha384)", "dhchap_dhgroup": "ffdhe3072"} {
		if got, _ := os.ReadFile(filepath.Join(host, name)); strings.TrimSpace(string(got)) != want {
			t.Errorf("the host entry's %s is not the restricted grant's", name)
		}
	}
	for _, s := range []string{subNQN, sub2} {
		if _, err := os.Readlink(filepath.Join(g.configfs, "stor-eu-1", "subsystems", s, "allowed_hosts", c1.Grant.HostNqn)); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	// Renewing the internal grant keeps the stronger authentication.
	r1, err := ac.Renew(ctx, &pb.RenewRequest{GrantId: c1.Grant.GrantId})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Credentials.DhchapHostSecret != c2.Credentials.DhchapHostSecret {
		t.Fatal("the renewed internal grant's secret is not the host entry's")
	}
	grants := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"grant"}})
	if len(grants) != 2 || !strings.Contains(grants[1].Detail, "moves "+c1.Grant.GrantId) {
		t.Fatalf("grant entries %+v", grants)
	}
	// Another node on the restricted subsystem is unaffected.
	if _, err := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2")).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub2}); err != nil {
		t.Fatalf("another node on the restricted subsystem: %v", err)
	}
}

// addSecondSubsystem adds subsystem nqn on acme's target stor-eu-1 with one
// namespace of data class class, and admits job-1 over both subsystems.
func addSecondSubsystem(t *testing.T, g *testGateway, nqn, class string) {
	t.Helper()
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: nqn, TargetId: "stor-eu-1", Tenant: "acme", PortIds: []uint32{1}, Dhchap: true}}); err != nil {
		t.Fatal(err)
	}
	ns := validNamespace()
	ns.SubsystemNqn, ns.DataClass = nqn, class
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	req := admitRequest("job-1")
	req.Namespaces = append(req.Namespaces, &pb.JobNamespace{SubsystemNqn: nqn, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY})
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// A reason that looks like key material is refused where it is typed
// (the audit log would refuse it, and with it the revocation); the same
// revocation with a plain reason goes through.
func TestRevokeReasonWithKeyMaterial(t *testing.T) {
	g, ctx := admittedGateway(t)
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	ac := pb.NewAccessClient(g.client(t, admin))
	_, err := ac.Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_JobId{JobId: "job-1"}, Reason: "leaked DHHC-1:00:abcd: in a ticket"})
	wantCode(t, err, codes.InvalidArgument, "reason", "key material")
	_, err = pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1", Reason: "nvmetlskey-1:01:x:"})
	wantCode(t, err, codes.InvalidArgument, "reason", "key material")
	rv, err := ac.Revoke(ctx, &pb.RevokeRequest{Selector: &pb.RevokeRequest_JobId{JobId: "job-1"}, Reason: "secret leaked in a ticket"})
	if err != nil || len(rv.RevokedGrantIds) != 1 {
		t.Fatalf("revoke: %v %v", rv, err)
	}
	if hs := hostsOn(t, g); len(hs) != 0 {
		t.Fatalf("hosts after revoke: %v", hs)
	}
}

// A node that renews or releases a grant that is not its own — another
// node's of its job, of its tenant outside the job, of another tenant — gets
// exactly the answer of a grant ID that does not exist: NotFound, with
// nothing about the grant (not its host NQN, job or owner), so it learns
// neither what the grant is nor that it exists. The auditor still sees each
// attempt, with the grant it was about.
func TestOthersGrantRevealsNothing(t *testing.T) {
	g, ctx := admittedGateway(t)
	owner := pb.NewAccessClient(g.client(t, node))
	c, err := owner.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	gr := c.Grant
	const noSuchGrant = "g-0000000000000000000000"
	secrets := []string{gr.HostNqn, gr.JobId, gr.Node, gr.SubsystemNqn, gr.GrantId, noSuchGrant}

	type answer struct {
		code codes.Code
		msg  string
	}
	ask := func(cl pb.AccessClient, id string) (renew, release answer) {
		_, err := cl.Renew(ctx, &pb.RenewRequest{GrantId: id})
		st := status.Convert(err)
		renew = answer{st.Code(), st.Message()}
		_, err = cl.Release(ctx, &pb.ReleaseRequest{GrantId: id})
		st = status.Convert(err)
		release = answer{st.Code(), st.Message()}
		return renew, release
	}
	wantRenew, wantRelease := ask(owner, noSuchGrant)
	if wantRenew.code != codes.NotFound || wantRelease.code != codes.NotFound {
		t.Fatalf("unknown grant: renew %v, release %v; want NotFound", wantRenew, wantRelease)
	}
	others := []string{"/node/acme-gpu-2", "/node/acme-gpu-3", "/node/globex-gpu-1", admin}
	for _, who := range others {
		cl := pb.NewAccessClient(g.client(t, who))
		for _, id := range []string{gr.GrantId, noSuchGrant} {
			renew, release := ask(cl, id)
			if renew != wantRenew || release != wantRelease {
				t.Errorf("%s, grant %s: renew %v, release %v; want %v, %v (a grant that does not exist)", who, id, renew, release, wantRenew, wantRelease)
			}
			for _, a := range []answer{renew, release} {
				for _, s := range secrets {
					if strings.Contains(a.msg, s) {
						t.Errorf("%s, grant %s: answer %q names %q", who, id, a.msg, s)
					}
				}
			}
		}
	}
	// The grant is untouched, and still its owner's to renew and release.
	if hs := hostsOn(t, g); len(hs) != 1 || hs[0] != gr.HostNqn {
		t.Fatalf("hosts after the others' attempts: %v", hs)
	}
	if _, err := owner.Renew(ctx, &pb.RenewRequest{GrantId: gr.GrantId}); err != nil {
		t.Fatal(err)
	}
	// Nodes may not list grants at all; the refusal names none.
	for _, who := range []string{"/node/acme-gpu-2", "/node/globex-gpu-1"} {
		_, err := pb.NewAccessClient(g.client(t, who)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1"})
		wantCode(t, err, codes.PermissionDenied)
		for _, s := range []string{gr.HostNqn, gr.GrantId, gr.Node} {
			if strings.Contains(status.Convert(err).Message(), s) {
				t.Errorf("%s: list grants answer %q names %q", who, status.Convert(err).Message(), s)
			}
		}
	}
	if _, err := owner.Release(ctx, &pb.ReleaseRequest{GrantId: gr.GrantId}); err != nil {
		t.Fatal(err)
	}

	// Each attempt is a deny entry; those on the existing grant name it,
	// its job and host, for the auditor.
	var denies []audit.Entry
	for _, e := range queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"deny"}}) {
		if !strings.HasPrefix(e.Detail, "access.list_grants") {
			denies = append(denies, e)
		}
	}
	if want := 2 * (len(others)*2 + 1); len(denies) != want {
		t.Fatalf("%d deny entries, want %d", len(denies), want)
	}
	onGrant := 0
	for _, e := range denies {
		if e.GrantID == gr.GrantId {
			onGrant++
			if e.JobID != "job-1" || e.HostNQN != gr.HostNqn || e.Tenant != "acme" || !strings.Contains(e.Detail, "another node") {
				t.Errorf("deny entry %+v", e)
			}
		} else if e.GrantID != noSuchGrant || e.JobID != "" || !strings.HasSuffix(e.Detail, "no such grant") {
			t.Errorf("deny entry %+v", e)
		}
	}
	if onGrant != 2*len(others) {
		t.Errorf("%d deny entries name the grant, want %d", onGrant, 2*len(others))
	}
}

// Issue 14, through the API: an unbound node of acme connects with its
// derived host NQN; an admin then binds a globex node to that NQN. Were it
// accepted, the globex node would be handed the same DH-HMAC-CHAP secret
// on the same nvmet target while the NQN is still allowed on acme's
// subsystem. It is refused (FailedPrecondition naming the grant) until the
// grant is revoked; then acme's node, whose default NQN is now bound, is
// refused in turn. An upper-case spelling of the NQN (one host, RFC 9562)
// is no way around it.
func TestBindNQNOfActiveGrantRefused(t *testing.T) {
	g, ctx := admittedGateway(t)
	derived, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test" + node)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if c.Grant.HostNqn != derived {
		t.Fatalf("granted host NQN %q, want the derived %q", c.Grant.HostNqn, derived)
	}

	inv := pb.NewInventoryClient(g.client(t, admin))
	bind := func(nqn string) error {
		_, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
			SpiffeId: "spiffe://nvmegate.test/node/globex-gpu-1", HostNqn: nqn, Tenant: "globex"}})
		return err
	}
	wantCode(t, bind(derived), codes.FailedPrecondition, derived, "active grant "+c.Grant.GrantId, "revoke them first")
	upper := nvmegate.UUIDNQNPrefix + strings.ToUpper(strings.TrimPrefix(derived, nvmegate.UUIDNQNPrefix))
	if upper == derived {
		t.Fatalf("derived NQN %q has no letter to change the case of", derived)
	}
	wantCode(t, bind(upper), codes.InvalidArgument, "binding.host_nqn", "lower case", derived)
	if _, err := inv.GetHostBinding(ctx, &pb.GetHostBindingRequest{SpiffeId: "spiffe://nvmegate.test/node/globex-gpu-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused binding was stored: %v", err)
	}
	// The conflict is on the record, and so is the malformed request after
	// it (validation refusals are recorded, their values withheld).
	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{})
	if e := entries[len(entries)-1]; e.Kind != audit.EventInvalid || strings.Contains(e.Detail, upper) {
		t.Fatalf("last entry %+v, want the invalid request, without its value", e)
	}
	if e := entries[len(entries)-2]; e.HostNQN != derived || !strings.Contains(e.Detail, "add_host_binding") || !strings.Contains(e.Detail, "failed (conflict)") {
		t.Fatalf("entry %+v, want the refused binding", e)
	}

	rv, err := pb.NewAccessClient(g.client(t, admin)).Revoke(ctx, &pb.RevokeRequest{
		Selector: &pb.RevokeRequest_Node{Node: "spiffe://nvmegate.test" + node}, Reason: "its host NQN goes to globex"})
	if err != nil || len(rv.RevokedGrantIds) != 1 {
		t.Fatalf("revoke: %v %v", rv, err)
	}
	if err := bind(derived); err != nil {
		t.Fatalf("binding after the revocation: %v", err)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	wantCode(t, err, codes.FailedPrecondition, "bound to another identity")
}

// hookedAudit runs before (if set) ahead of each append: a test's way to
// change the store between a call's description and its commit.
// The reverse race of issue 14: an unbound node's connect is described
// while its derived NQN is free, and an admin binds that NQN to a globex
// node before the grant commits. The commit checks again and refuses: no
// grant, the target never allows the host, the failure is recorded.
func TestConnectRefusedWhenNQNBoundBeforeCommit(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	derived, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test" + node)
	if err != nil {
		t.Fatal(err)
	}
	// The connect's next write is its grant's commit: described and
	// decided already, the binding comes first.
	var fired atomic.Bool
	bind := func() {
		if fired.Swap(true) {
			return
		}
		if err := g.db.CreateHostBinding(context.Background(), &nvmegate.HostBinding{
			SPIFFEID: "spiffe://nvmegate.test/node/globex-gpu-1", HostNQN: derived, Tenant: "globex"}); err != nil {
			t.Errorf("binding during the connect: %v", err)
		}
	}
	g.journal.before.Store(&bind)
	_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	wantCode(t, err, codes.FailedPrecondition, "bound to another identity", "not granted")
	if _, err := os.Stat(filepath.Join(g.configfs, "stor-eu-1", "hosts", derived)); !os.IsNotExist(err) {
		t.Fatalf("the target holds the host: %v", err)
	}
	active, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{State: pb.GrantState_GRANT_STATE_ACTIVE})
	if err != nil || len(active.Grants) != 0 {
		t.Fatalf("active grants %v (%v)", active, err)
	}
	denies := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"deny"}})
	if len(denies) != 1 || !strings.Contains(denies[0].Detail, "grant not stored") || denies[0].HostNQN != derived {
		t.Fatalf("deny entries %+v", denies)
	}
}

// A node asking for a zero, negative or malformed lifetime is refused
// InvalidArgument on ttl, for Connect and Renew alike, rather than given
// the default it did not ask for; an unset ttl is the default.
func TestNonPositiveTTL(t *testing.T) {
	g, ctx := admittedGateway(t)
	ac := pb.NewAccessClient(g.client(t, node))
	for _, d := range []*durationpb.Duration{durationpb.New(0), durationpb.New(-time.Hour), durationpb.New(-time.Nanosecond)} {
		_, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN, Ttl: d})
		wantCode(t, err, codes.InvalidArgument, "ttl", "must be positive", d.AsDuration().String(), "unset for the default")
	}
	_, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN, Ttl: &durationpb.Duration{Seconds: 1, Nanos: -1}})
	wantCode(t, err, codes.InvalidArgument, "ttl", "valid duration")

	before := time.Now()
	c, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if exp := c.Grant.ExpiresAt.AsTime(); exp.Before(before.Add(time.Hour-time.Minute)) || exp.After(time.Now().Add(time.Hour)) {
		t.Fatalf("unset ttl: expires %v, want the default hour from %v", exp, before)
	}
	for _, d := range []*durationpb.Duration{durationpb.New(0), durationpb.New(-time.Second)} {
		_, err := ac.Renew(ctx, &pb.RenewRequest{GrantId: c.Grant.GrantId, Ttl: d})
		wantCode(t, err, codes.InvalidArgument, "ttl", "must be positive")
	}
	if _, err := ac.Renew(ctx, &pb.RenewRequest{GrantId: c.Grant.GrantId, Ttl: durationpb.New(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
}

// The NQN-reuse case that a revocation does not cover: an unbound node
// connects with its derived NQN X and releases its grant (no revocation,
// no rotation). An admin then binds X to another node on the same nvmet
// target. Credentials derive from (host NQN, key scope, root version), so
// without a rotation the new holder would be handed the very secret the
// first node still knows. The binding rotates that root first: the new
// holder's secret is another one, and the first node's knowledge is
// useless after the grace.
func TestRebindAfterReleaseRotates(t *testing.T) {
	g, ctx := admittedGateway(t)
	first := pb.NewAccessClient(g.client(t, node))
	c, err := first.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Release(ctx, &pb.ReleaseRequest{GrantId: c.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	x := c.Grant.HostNqn
	inv := pb.NewInventoryClient(g.client(t, admin))
	// A binding the store refuses (its identity is bound already) rotates
	// nothing: the first node connects again at the same root version.
	if _, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test/node/acme-gpu-3", HostNqn: "nqn.2014-08.org.nvmexpress:uuid:00000003-aaaa-4000-8000-000000000000", Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	_, err = inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test/node/acme-gpu-3", HostNqn: x, Tenant: "acme"}})
	wantCode(t, err, codes.AlreadyExists)
	again, err := first.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if again.Grant.KeyVersion != c.Grant.KeyVersion {
		t.Fatalf("a refused binding rotated the root: version %d, was %d", again.Grant.KeyVersion, c.Grant.KeyVersion)
	}
	if _, err := first.Release(ctx, &pb.ReleaseRequest{GrantId: again.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	second := "spiffe://nvmegate.test/node/acme-gpu-2"
	if _, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: second, HostNqn: x, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	c2, err := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2")).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	if c2.Grant.HostNqn != x {
		t.Fatalf("the new holder connected as %s, want %s", c2.Grant.HostNqn, x)
	}
	if c2.Credentials.DhchapHostSecret == c.Credentials.DhchapHostSecret {
		t.Fatal("the new holder of the NQN was handed the secret its earlier holder knows")
	}
	if c2.Grant.KeyVersion <= c.Grant.KeyVersion {
		t.Fatalf("root version %d after the rebinding, was %d: not rotated", c2.Grant.KeyVersion, c.Grant.KeyVersion)
	}
}

// A node that connects again gets a new grant, and its earlier one is
// released in the same commit and says which grant replaced it.
func TestReconnectSupersedes(t *testing.T) {
	g, ctx := admittedGateway(t)
	ac := pb.NewAccessClient(g.client(t, node))
	first, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	second, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{admin} {
		list, err := pb.NewAccessClient(g.client(t, who)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1"})
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		got := map[string]*pb.Grant{}
		for _, gr := range list.Grants {
			got[gr.GrantId] = gr
		}
		old, cur := got[first.Grant.GrantId], got[second.Grant.GrantId]
		if old == nil || cur == nil {
			t.Fatalf("%s lists %v", who, list.Grants)
		}
		if old.State != pb.GrantState_GRANT_STATE_RELEASED || old.SupersededBy != second.Grant.GrantId || old.RemovalPending {
			t.Fatalf("%s sees the earlier grant %v, superseded by %q, pending %v", who, old.State, old.SupersededBy, old.RemovalPending)
		}
		if cur.State != pb.GrantState_GRANT_STATE_ACTIVE || cur.SupersededBy != "" {
			t.Fatalf("%s sees the new grant %v, superseded by %q", who, cur.State, cur.SupersededBy)
		}
	}
	// The target holds the host at the new grant's key.
	key, _ := os.ReadFile(filepath.Join(g.configfs, "stor-eu-1", "hosts", second.Grant.HostNqn, "dhchap_key"))
	if strings.TrimSpace(string(key)) != second.Credentials.DhchapHostSecret {
		t.Fatal("the host's entry does not hold the new grant's secret")
	}
}

// The gateway seals a job's scope once per store revision and shares it
// among the job's nodes (sealedScopes): a change to the records of the
// scope is decided at the next connect — a namespace of a class policy
// does not know, added to the subsystem, refuses it; its removal allows it
// again — and a node that is not the job's is refused on the
// scope another node's connect sealed.
func TestConnectDecidesEachRevisionsScope(t *testing.T) {
	g, ctx := admittedGateway(t)
	ac := pb.NewAccessClient(g.client(t, node))
	connect := func() error {
		_, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
		return err
	}
	if err := connect(); err != nil {
		t.Fatal(err)
	}
	stranger := pb.NewAccessClient(g.client(t, "/node/acme-gpu-9"))
	if _, err := stranger.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a node not in the job, on the sealed scope: %v", err)
	}
	inv := pb.NewInventoryClient(g.client(t, admin))
	unknown := validNamespace()
	unknown.Nsid, unknown.DataClass = 2, "topsecret"
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: unknown}); err != nil {
		t.Fatal(err)
	}
	if err := connect(); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "topsecret") {
		t.Fatalf("after a namespace of a class policy does not know joined the subsystem: %v", err)
	}
	if _, err := inv.RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 2}); err != nil {
		t.Fatal(err)
	}
	if err := connect(); err != nil {
		t.Fatalf("after it left: %v", err)
	}
}

// Removing a node's host binding ends its access: its grant is revoked
// (recorded, with the reason), its host leaves the target, and only then
// is the removal answered OK; the node, unbound, connects again under its
// default host NQN. Another identity cannot remove the binding, and a
// binding that is not there is NotFound (nothing revoked).
func TestRemoveHostBindingEndsAccess(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	id := "spiffe://nvmegate.test" + node
	inv := pb.NewInventoryClient(g.client(t, admin))
	if _, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: id, HostNqn: hostNQN, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	ac := pb.NewAccessClient(g.client(t, node))
	c1, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil || c1.Grant.HostNqn != hostNQN {
		t.Fatalf("connect: %v %v", c1, err)
	}
	link := filepath.Join(g.configfs, "stor-eu-1", "subsystems", subNQN, "allowed_hosts", hostNQN)
	if _, err := os.Readlink(link); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewInventoryClient(g.client(t, sched)).RemoveHostBinding(ctx, &pb.RemoveHostBindingRequest{SpiffeId: id}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the scheduler removing a binding: %v", err)
	}
	if _, err := inv.RemoveHostBinding(ctx, &pb.RemoveHostBindingRequest{SpiffeId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Readlink(link); !os.IsNotExist(err) {
		t.Fatalf("the host is still allowed on the target: %v", err)
	}
	list, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1"})
	if err != nil || len(list.Grants) != 1 || list.Grants[0].GrantId != c1.Grant.GrantId || list.Grants[0].State != pb.GrantState_GRANT_STATE_REVOKED {
		t.Fatalf("grants after the removal: %v %v", list, err)
	}
	revokes := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"revoke"}})
	if len(revokes) != 1 || revokes[0].GrantID != c1.Grant.GrantId || revokes[0].Caller != "spiffe://nvmegate.test"+admin ||
		revokes[0].Detail != "host binding of "+id+" removed" {
		t.Fatalf("revoke entries %+v", revokes)
	}
	if _, err := inv.RemoveHostBinding(ctx, &pb.RemoveHostBindingRequest{SpiffeId: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("removing it again: %v", err)
	}
	c2, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil || c2.Grant.HostNqn == hostNQN {
		t.Fatalf("reconnect, unbound: %v %v", c2, err)
	}
}
