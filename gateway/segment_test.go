package gateway_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Fabric segmentation end to end: a target with ports on two subnets; a
// node whose segment holds one of them discovers and is handed only that
// port; a node whose segment holds neither is refused the connect by the
// shipped Rego, naming its segment, and discovers no port; an unsegmented
// node sees both.
func TestFabricSegmentation(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	tg := validTarget()
	tg.Ports = []*pb.Port{
		{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.1.2.10", ServiceId: "4420", Subnet: "10.1.2.0/24"},
		{Id: 2, Transport: "tcp", AddressFamily: "ipv4", Address: "10.2.2.10", ServiceId: "4420", Subnet: "10.2.2.0/24"},
	}
	sub := validSubsystem()
	sub.Tls = false
	for _, err := range []error{
		func() error { _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: tg}); return err }(),
		func() error { _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub}); return err }(),
		func() error {
			_, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	bind := func(path, nqn string, subnets ...string) {
		t.Helper()
		if _, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
			SpiffeId: "spiffe://nvmegate.test" + path, HostNqn: nqn, Tenant: "acme", Subnets: subnets}}); err != nil {
			t.Fatal(err)
		}
	}
	bind(node, hostNQN, "10.1.0.0/16")
	bind("/node/acme-gpu-2", "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000", "10.9.0.0/16")
	req := admitRequest("job-1")
	req.Nodes = append(req.Nodes, "spiffe://nvmegate.test/node/acme-gpu-3")
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, req); err != nil {
		t.Fatal(err)
	}
	addrs := func(es []*pb.DiscoveryEntry) string {
		var out []string
		for _, e := range es {
			out = append(out, e.Traddr)
		}
		return strings.Join(out, ",")
	}

	// In the segment of port 1.
	n1 := pb.NewAccessClient(g.client(t, node))
	if d, err := n1.Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"}); err != nil || addrs(d.Entries) != "10.1.2.10" {
		t.Fatalf("discover in segment: %v, %v", d, err)
	}
	c, err := n1.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.ConnectArgs, " ")
	if !strings.Contains(args, "10.1.2.10") || strings.Contains(args, "10.2.2.10") || addrs(c.Grant.Ports) != "10.1.2.10" {
		t.Fatalf("connect in segment: args %q, entries %s", args, addrs(c.Grant.Ports))
	}

	// Outside every port's subnet.
	n2 := pb.NewAccessClient(g.client(t, "/node/acme-gpu-2"))
	if d, err := n2.Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"}); err != nil || len(d.Entries) != 0 {
		t.Fatalf("discover outside the segment: %v, %v", d, err)
	}
	_, err = n2.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "fabric segment") {
		t.Fatalf("connect outside the segment: %v", err)
	}

	// Unsegmented (no binding: the derived NQN, no subnets).
	n3 := pb.NewAccessClient(g.client(t, "/node/acme-gpu-3"))
	if d, err := n3.Discover(ctx, &pb.DiscoverRequest{JobId: "job-1"}); err != nil || addrs(d.Entries) != "10.1.2.10,10.2.2.10" {
		t.Fatalf("discover unsegmented: %v, %v", d, err)
	}
}
