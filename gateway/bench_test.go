package gateway_test

import (
	"testing"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// BenchmarkGetTarget measures one authorized read through the whole stack:
// gRPC over an established mTLS connection, validation, OPA evaluation of the
// shipped policy, bbolt read, conversion. Run in parallel to load both the
// gateway's and the client's goroutines like a busy admin tool would.
func BenchmarkGetTarget(b *testing.B) {
	g := startGateway(b)
	inv := pb.NewInventoryClient(g.client(b, admin))
	ctx := b.Context()
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		b.Fatal(err)
	}
	req := &pb.GetTargetRequest{Id: "stor-eu-1"}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := inv.GetTarget(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDenied measures a request refused by policy: the cost an
// unauthorized caller can impose per call.
func BenchmarkDenied(b *testing.B) {
	g := startGateway(b)
	inv := pb.NewInventoryClient(g.client(b, node))
	ctx := b.Context()
	req := &pb.GetTargetRequest{Id: "stor-eu-1"}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := inv.GetTarget(ctx, req); err == nil {
			b.Fatal("node allowed")
		}
	}
}
