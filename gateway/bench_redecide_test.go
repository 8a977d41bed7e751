package gateway_test

import (
	"fmt"
	"io/fs"
	"testing"
	"testing/fstest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/policy"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// BenchmarkRedecideAfterPolicyLoad measures what a policy load costs the
// active grants (issue 15: 10,000 re-decided within 2 s of a load): each
// op loads a new policy revision (untimed) and re-decides every active
// grant under it, cold — no decision of the new revision is memoized yet.
// The grants are real: 10,000 nodes of one job connected through the
// gateway. A dry run, as every grant stays allowed: what is timed is the
// re-decision, not the revocations (each of which is a revoke, timed by
// the lease's own tests).
//
//	go test -run '^$' -bench RedecideAfterPolicyLoad -benchtime 5x ./gateway
func BenchmarkRedecideAfterPolicyLoad(b *testing.B) {
	const grants = 10000
	g := startGateway(b)
	acmeInventory(b, g)
	ctx := b.Context()
	ids := make([]string, grants)
	for i := range ids {
		ids[i] = fmt.Sprintf("spiffe://nvmegate.test/node/re-%d", i)
	}
	req := admitRequest("job-re")
	req.Nodes, req.ExpiresAt = ids, timestamppb.New(time.Now().Add(2*time.Hour))
	if _, err := pb.NewJobsClient(g.client(b, sched)).Admit(ctx, req); err != nil {
		b.Fatal(err)
	}
	var eg errgroup.Group
	eg.SetLimit(32)
	for _, id := range ids {
		eg.Go(func() error {
			now := time.Now()
			svid, err := g.ca.Issue(spiffeid.RequireFromString(id), now.Add(-time.Minute), now.Add(time.Hour))
			if err != nil {
				return err
			}
			c := nodeConn(b, g, svid)
			defer c.Close()
			_, err = pb.NewAccessClient(c).Connect(ctx, &pb.ConnectRequest{JobId: "job-re", SubsystemNqn: subNQN})
			return err
		})
	}
	if err := eg.Wait(); err != nil {
		b.Fatal(err)
	}
	files := fstest.MapFS{}
	if err := fs.WalkDir(policy.Default(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(policy.Default(), p)
		files[p] = &fstest.MapFile{Data: data}
		return err
	}); err != nil {
		b.Fatal(err)
	}
	rego := files["authz.rego"].Data
	b.ReportAllocs()
	rev := 0
	for b.Loop() {
		b.StopTimer()
		rev++
		files["authz.rego"].Data = fmt.Appendf(append([]byte{}, rego...), "\n# revision %d\n", rev)
		bundle, err := policy.Load(files)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.engine.Reload(ctx, bundle, "bench"); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		d, err := g.srv.Redecide(ctx, gateway.Change{All: true, Cause: "bench"}, nil, true)
		if err != nil {
			b.Fatal(err)
		}
		if d.Checked != grants || len(d.Ending)+len(d.Tightening) != 0 {
			b.Fatalf("re-decided %d, %d ending, %d tightening", d.Checked, len(d.Ending), len(d.Tightening))
		}
	}
	b.ReportMetric(float64(grants)*float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}
