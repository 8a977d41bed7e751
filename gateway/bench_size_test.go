package gateway_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/identity"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// BenchmarkConnectTargetSize measures a change of one host on a target that
// already holds 10 or 10,000 hosts: each op is a Connect that adds a node's
// host to the target (programmed and acknowledged before the answer) and
// the Release that removes it again. A connect's cost must not grow with
// the hosts already on its target (issue 13: the two within 1.5×).
//
//	go test -run '^$' -bench ConnectTargetSize -benchtime 400x ./gateway
func BenchmarkConnectTargetSize(b *testing.B) {
	for _, hosts := range []int{10, 10000} {
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) {
			benchConnectOnTarget(b, hosts)
		})
	}
}

func benchConnectOnTarget(b *testing.B, hosts int) {
	g := startGateway(b)
	acmeInventory(b, g)
	ctx := b.Context()
	const pool = 32 // nodes taking turns to connect and release in the timed loop
	ids := make([]string, hosts+pool)
	for i := range ids {
		ids[i] = fmt.Sprintf("spiffe://nvmegate.test/node/size-%d", i)
	}
	req := admitRequest("job-size")
	req.Nodes, req.ExpiresAt = ids, timestamppb.New(time.Now().Add(2*time.Hour))
	if _, err := pb.NewJobsClient(g.client(b, sched)).Admit(ctx, req); err != nil {
		b.Fatal(err)
	}
	conn := func(id string) *grpc.ClientConn {
		now := time.Now()
		svid, err := g.ca.Issue(spiffeid.RequireFromString(id), now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			b.Fatal(err)
		}
		return nodeConn(b, g, svid)
	}
	// The hosts already on the target: each node connects once.
	var eg errgroup.Group
	eg.SetLimit(32)
	for _, id := range ids[:hosts] {
		eg.Go(func() error {
			c := conn(id)
			defer c.Close()
			_, err := pb.NewAccessClient(c).Connect(ctx, &pb.ConnectRequest{JobId: "job-size", SubsystemNqn: subNQN})
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		b.Fatal(err)
	}
	clients := make([]pb.AccessClient, pool)
	for i := range clients {
		c := conn(ids[hosts+i])
		b.Cleanup(func() { c.Close() })
		clients[i] = pb.NewAccessClient(c)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		ac := clients[i%pool]
		i++
		resp, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-size", SubsystemNqn: subNQN})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ac.Release(ctx, &pb.ReleaseRequest{GrantId: resp.Grant.GrantId}); err != nil {
			b.Fatal(err)
		}
	}
}

// nodeConn connects with svid, closed by the caller.
func nodeConn(b *testing.B, g *testGateway, svid *x509svid.SVID) *grpc.ClientConn {
	c, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(identity.ClientCredentials(identity.StaticSource(svid, g.ca.Bundle()), identity.AuthorizeGateway(spiffeid.RequireTrustDomainFromString("nvmegate.test")))))
	if err != nil {
		b.Fatal(err)
	}
	return c
}
