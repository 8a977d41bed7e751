package authz_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/authz"
)

func BenchmarkAuthorize(b *testing.B) {
	e, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td})
	if err != nil {
		b.Fatal(err)
	}
	resource := map[string]any{"target": map[string]any{"id": "t1", "region": "eu-west", "fabric": "f1"}}
	for _, bc := range []struct {
		name, id, method string
		allow            bool
	}{
		{"allow", "spiffe://example.org/admin/alice", "/nvmegate.v1.Inventory/AddTarget", true},
		{"deny", "spiffe://example.org/node/gpu-01", "/nvmegate.v1.Inventory/AddTarget", false},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := authz.NewInput(authz.ParseCaller(spiffeid.RequireFromString(bc.id)), bc.method, "", resource)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				d, err := e.Authorize(ctx, in)
				if err != nil || d.Allow != bc.allow {
					b.Fatal(d, err)
				}
			}
		})
	}
}

// BenchmarkUnaryInterceptor is the whole per-call cost in the server:
// peer ID, ParseCaller, input, evaluation, context.
func BenchmarkUnaryInterceptor(b *testing.B) {
	e, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td})
	if err != nil {
		b.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://example.org/admin/alice")
	ic := authz.UnaryServerInterceptor(e, nil, slog.New(slog.DiscardHandler),
		authz.WithPeerID(func(context.Context) (spiffeid.ID, bool) { return id, true }))
	info := &grpc.UnaryServerInfo{FullMethod: "/nvmegate.v1.Inventory/AddTarget"}
	h := func(ctx context.Context, req any) (any, error) { return req, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ic(ctx, nil, info, h); err != nil {
			b.Fatal(err)
		}
	}
}
