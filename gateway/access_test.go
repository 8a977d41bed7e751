package gateway_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// A node of an active job discovers the job's subsystem ports and the host
// NQN it must use; nodes outside the job, of another tenant, or after the
// job finished learn nothing.
func TestDiscover(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
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
}
