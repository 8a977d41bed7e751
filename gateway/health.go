package gateway

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nvmegate/nvmegate"
)

// stoppingHealth is grpc-go's health service whose Watch streams end when
// the gateway starts shutting down. Left alone they last until the client
// hangs up, and the graceful stop waits the whole ShutdownTimeout for them.
type stoppingHealth struct {
	*health.Server
	stopping <-chan struct{}
}

func (h stoppingHealth) Watch(req *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := h.Server.Watch(req, watchStream{stream, ctx})
	select {
	case <-h.stopping:
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "the gateway is shutting down; watch another")
	default:
		return err
	}
}

// watchStream is a stream with another context.
type watchStream struct {
	grpc.ServerStreamingServer[healthpb.HealthCheckResponse]
	ctx context.Context
}

func (w watchStream) Context() context.Context { return w.ctx }
