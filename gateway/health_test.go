package gateway_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nvmegate/nvmegate/gateway"
)

// A shutdown ends health Watch streams (Unavailable) instead of waiting
// for their clients through the whole graceful-stop timeout.
func TestShutdownEndsHealthWatches(t *testing.T) {
	g := startGateway(t, func(c *gateway.Config) { c.ShutdownTimeout = time.Hour })
	ctx := ctxT(t)
	w, err := healthpb.NewHealthClient(g.client(t, admin)).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first health: %v %v", r, err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- g.stop() }()
	for {
		r, err := w.Recv()
		if err != nil {
			wantCode(t, err, codes.Unavailable, "shutting down")
			break
		}
		if r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health during shutdown: %v", r.Status)
		}
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(time.Minute): // a hang detector: the stop timeout is an hour
		t.Fatal("the graceful stop still waits after the watches ended")
	}
}
