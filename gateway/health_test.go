package gateway_test

import (
	"errors"
	"net"
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

// A peer that opens a connection and never finishes its TLS handshake is
// disconnected after the handshake timeout: idle connections cannot pile
// up on the gateway.
func TestIdleHandshakeIsCutOff(t *testing.T) {
	g := startGateway(t, func(c *gateway.Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	n, err := conn.Read(make([]byte, 1))
	if err == nil || n != 0 {
		t.Fatalf("read %d bytes, err %v: want the gateway to close the idle connection", n, err)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the gateway kept an idle, unauthenticated connection open for %s", time.Since(start).Round(time.Millisecond))
	}
	// Meanwhile a real client is served.
	if _, err := healthpb.NewHealthClient(g.client(t, node)).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}
