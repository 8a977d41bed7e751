package gateway_test

import (
	"testing"

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
