package main

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// A change acknowledged by one replica is in force through the other for
// every call that starts after the acknowledgement, and on the target
// whose agent streams from the other: each pair "change through A, then
// act through B" at once, with no wait between (issue 30, item 4): the
// pairs that hold today. Two do not yet, and are not here: a policy is
// loaded from each replica's own files, and a credential root rotated by
// hand through A is used by B only after its next refresh (up to 30 s).
// Both need the one log of issue 30. (A revocation's rotation is in force
// through B at once: it is made before the revocation is stored, and B
// drops the scope's kept roots as it applies it.)
func TestChangeThroughOneReplicaInForceThroughTheOther(t *testing.T) {
	f := newFleet(t, 1)
	dir := f.dir
	a, _ := f.replica(t, "a", "--remote-targets", "stor-eu-1")
	b, _ := f.replica(t, "b", "--remote-targets", "stor-eu-1")
	sub := acmeJob(t, dir, a.GRPCAddr(), a.GRPCAddr(), "stor-eu-1")
	root := t.TempDir()
	hosts := subsystemHosts(root, sub)
	// The target's agent streams from B: every change through A reaches
	// the target through B's copy.
	runAgent(t, &targetagent.Remote{Replicas: []grpc.ClientConnInterface{devConn(t, b.GRPCAddr(), dir, "target-stor-eu-1")},
		Driver: &nvmet.Driver{Root: root}})
	waitUntil(t, "the agent attached to b", func() bool { return b.hub.Connected("stor-eu-1") })

	through := func(m *Main, who string) *grpc.ClientConn { return devConn(t, m.GRPCAddr(), dir, who) }
	admit := func(t *testing.T, job string) {
		t.Helper()
		_, err := pb.NewJobsClient(through(a, "acme-scheduler")).Admit(ctxT(t), &pb.AdmitRequest{JobId: job, Tenant: "acme",
			Nodes:          []string{"spiffe://nvmegate.test/node/acme-gpu-1", "spiffe://nvmegate.test/node/acme-gpu-2"},
			Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
			AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(2 * time.Hour))})
		if err != nil {
			t.Fatal(err)
		}
	}
	connect := func(t *testing.T, m *Main, node, job string) *pb.Grant {
		t.Helper()
		resp, err := pb.NewAccessClient(through(m, node)).Connect(ctxT(t), &pb.ConnectRequest{JobId: job, SubsystemNqn: sub})
		if err != nil {
			t.Fatalf("%s connects for %s: %v", node, job, err)
		}
		return resp.Grant
	}
	refused := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s through B right after the change through A: answered OK", what)
		}
		if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded || c == codes.Internal {
			t.Fatalf("%s through B: %v (want a refusal that says why, not a failure)", what, err)
		}
	}
	gone := func(t *testing.T, g *pb.Grant) {
		t.Helper()
		if slices.Contains(hosts(), g.HostNqn) {
			t.Fatalf("host %s still on the target behind B after the change through A answered", g.HostNqn)
		}
	}

	t.Run("release", func(t *testing.T) {
		admit(t, "job-release")
		g := connect(t, a, "acme-node-1", "job-release")
		if _, err := pb.NewAccessClient(through(a, "acme-node-1")).Release(ctxT(t), &pb.ReleaseRequest{GrantId: g.GrantId}); err != nil {
			t.Fatal(err)
		}
		_, err := pb.NewAccessClient(through(b, "acme-node-1")).Renew(ctxT(t), &pb.RenewRequest{GrantId: g.GrantId})
		refused(t, "a renewal of the released grant", err)
		gone(t, g)
	})
	t.Run("revoke", func(t *testing.T) {
		admit(t, "job-revoke")
		g := connect(t, b, "acme-node-1", "job-revoke")
		if _, err := pb.NewAccessClient(through(a, "admin")).Revoke(ctxT(t), &pb.RevokeRequest{Selector: &pb.RevokeRequest_GrantId{GrantId: g.GrantId}, Reason: "pair test"}); err != nil {
			t.Fatal(err)
		}
		_, err := pb.NewAccessClient(through(b, "acme-node-1")).Renew(ctxT(t), &pb.RenewRequest{GrantId: g.GrantId})
		refused(t, "a renewal of the revoked grant", err)
		gone(t, g)
		// The revocation rotated the root the host knew: the same host
		// granted again through B gets the new root, never the retired one.
		st, err := pb.NewKeysClient(through(a, "admin")).Status(ctxT(t), &pb.KeysStatusRequest{SubsystemNqn: sub, Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT})
		if err != nil || len(st.Keys) != 1 {
			t.Fatalf("keys status: %v %v", st, err)
		}
		again := connect(t, b, "acme-node-1", "job-revoke")
		if cur := st.Keys[0].CurrentVersion; cur <= g.KeyVersion || again.KeyVersion != cur {
			t.Fatalf("granted again through B under root v%d after the revocation through A rotated v%d to v%d", again.KeyVersion, g.KeyVersion, cur)
		}
	})
	t.Run("job finish", func(t *testing.T) {
		admit(t, "job-finish")
		g := connect(t, b, "acme-node-2", "job-finish")
		if _, err := pb.NewJobsClient(through(a, "acme-scheduler")).Finish(ctxT(t), &pb.FinishRequest{JobId: "job-finish", Reason: "pair test"}); err != nil {
			t.Fatal(err)
		}
		_, err := pb.NewAccessClient(through(b, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-finish", SubsystemNqn: sub})
		refused(t, "a connect for the finished job", err)
		_, err = pb.NewAccessClient(through(b, "acme-node-2")).Renew(ctxT(t), &pb.RenewRequest{GrantId: g.GrantId})
		refused(t, "a renewal of the finished job's grant", err)
		gone(t, g)
	})
	t.Run("binding removed", func(t *testing.T) {
		const id, nqn = "spiffe://nvmegate.test/node/acme-gpu-2", "nqn.2014-08.org.nvmexpress:uuid:0000002b-aaaa-4000-8000-000000000000"
		inv := pb.NewInventoryClient(through(a, "admin"))
		if _, err := inv.AddHostBinding(ctxT(t), &pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: id, HostNqn: nqn, Tenant: "acme"}}); err != nil {
			t.Fatal(err)
		}
		admit(t, "job-binding")
		g := connect(t, b, "acme-node-2", "job-binding")
		if g.HostNqn != nqn {
			t.Fatalf("the node connected as %s, not its bound NQN", g.HostNqn)
		}
		if _, err := inv.RemoveHostBinding(ctxT(t), &pb.RemoveHostBindingRequest{SpiffeId: id}); err != nil {
			t.Fatal(err)
		}
		_, err := pb.NewAccessClient(through(b, "acme-node-2")).Renew(ctxT(t), &pb.RenewRequest{GrantId: g.GrantId})
		refused(t, "a renewal by the node whose binding was removed", err)
		gone(t, g)
	})
}
