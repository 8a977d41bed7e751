package targetagent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/fabric"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Remote is the agent side of a target on its own storage server
// (cmd/nvmegate-target): it streams the target's desired state from the
// gateway, applies each generation with the local driver and acknowledges
// it; it reconnects with backoff when the stream ends (a gateway restart).
type Remote struct {
	Conn   grpc.ClientConnInterface // to the gateway, with the target's SVID
	Driver fabric.Driver
	Log    *slog.Logger
	// Applied, if set, is told of every generation applied (for tests and
	// status).
	Applied func(gen uint64, err error)
}

// Run works until ctx ends.
func (r *Remote) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backoff := 100 * time.Millisecond
	for {
		got, err := r.once(ctx, log)
		if got {
			backoff = 100 * time.Millisecond // a healthy stream: start over
		}
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("target agent: stream ended; reconnecting", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if backoff < 10*time.Second {
			backoff *= 2
		}
	}
}

// once streams until the stream ends; got says whether any state came.
func (r *Remote) once(ctx context.Context, log *slog.Logger) (got bool, err error) {
	c := pb.NewTargetAgentClient(r.Conn)
	stream, err := c.Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		return false, err
	}
	for {
		st, err := stream.Recv()
		if err != nil {
			return got, err
		}
		got = true
		aerr := r.Driver.Apply(ctx, StateFromProto(st))
		msg := ""
		if aerr != nil {
			msg = aerr.Error()
			log.Error("target agent: generation not applied", "generation", st.Generation, "err", aerr)
		}
		if r.Applied != nil {
			r.Applied(st.Generation, aerr)
		}
		if _, err := c.Ack(ctx, &pb.AckRequest{Generation: st.Generation, Error: msg}); err != nil {
			return got, errors.Join(errors.New("ack"), err)
		}
	}
}
