package targetagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/fabric"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// ErrStaleDelta is why a remote agent drops its stream: it received a
// delta whose base is not the generation it applied last (or its driver
// does not hold it). It reconnects, and the new stream starts with the
// whole state.
var ErrStaleDelta = errors.New("targetagent: a delta on top of a generation not applied here; reconnecting for the whole state")

// Remote is the agent side of a target on its own storage server
// (cmd/nvmegate-target): it streams the target's desired state from the
// gateway — whole, then deltas — applies each generation in order with the
// local driver and acknowledges it; it reconnects with backoff when the
// stream ends (a gateway restart).
type Remote struct {
	Conn   grpc.ClientConnInterface // to the gateway, with the target's SVID
	Driver Driver
	Log    *slog.Logger
	// Applied, if set, is told of every generation applied, or refused
	// (for tests and status).
	Applied func(gen uint64, err error)

	stream atomic.Value // string: the ID of the live stream, for Reencrypted
}

// Reencrypted reports the end of a namespace's re-encryption to the
// gateway on the live stream (cryptdev.Runner's Done). A report the
// gateway does not take is repeated when the next state starts the job
// again.
func (r *Remote) Reencrypted(ctx context.Context, sub string, nsid uint32, gen uint64, rerr error) error {
	id, _ := r.stream.Load().(string)
	msg := ""
	if rerr != nil {
		msg = rerr.Error()
	}
	_, err := pb.NewTargetAgentClient(r.Conn).Reencrypted(ctx, &pb.ReencryptedRequest{SubsystemNqn: sub, Nsid: nsid,
		Generation: gen, Error: msg, StreamId: id})
	return err
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
// Deltas are applied only on top of the generation this stream applied
// last: after a failed application, or a delta from another base, the
// stream is dropped and the next one starts with the whole state.
func (r *Remote) once(ctx context.Context, log *slog.Logger) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx) // ends the stream when this returns
	defer cancel()
	c := pb.NewTargetAgentClient(r.Conn)
	stream, err := c.Watch(ctx, &pb.WatchRequest{AcceptDeltas: true})
	if err != nil {
		return false, err
	}
	// Receive beside the application: when the gateway ends the stream
	// (this agent took too long, or another holds the target now), the
	// application in progress stops at its next step instead of writing
	// on over what the target's next agent applies.
	msgs := make(chan *pb.WatchResponse, 1)
	ended := make(chan error, 1) // why the stream ended, before ctx is cancelled
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				ended <- err
				cancel()
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		applied uint64
		have    bool // applied holds a generation applied on this stream
	)
	for {
		var m *pb.WatchResponse
		select {
		case m = <-msgs:
		case <-ctx.Done():
			select {
			case err := <-ended:
				return got, err
			default:
				return got, ctx.Err()
			}
		}
		got = true
		r.stream.Store(m.StreamId)
		u := UpdateFromProto(m)
		gen := u.Generation()
		var aerr error
		if u.Delta != nil {
			if !have || u.Delta.Base != applied {
				aerr = fmt.Errorf("generation %d is a delta from %d, the last applied here is %d: %w", gen, u.Delta.Base, applied, ErrStaleDelta)
			} else if aerr = r.Driver.ApplyDelta(ctx, *u.Delta); errors.Is(aerr, fabric.ErrNeedFull) {
				aerr = fmt.Errorf("generation %d: %w: %w", gen, ErrStaleDelta, aerr)
			}
		} else {
			aerr = r.Driver.Apply(ctx, *u.State)
		}
		applied, have = gen, aerr == nil
		msg := ""
		if aerr != nil {
			msg = aerr.Error()
			log.Error("target agent: generation not applied", "generation", gen, "err", aerr)
		}
		if r.Applied != nil {
			r.Applied(gen, aerr)
		}
		// A refused acknowledgement (the gateway ended this stream: it
		// took too long) drops the stream too; so does a failed
		// application, which the gateway answers by ending the stream.
		if _, err := c.Ack(ctx, &pb.AckRequest{Generation: gen, Error: msg, StreamId: m.StreamId}); err != nil {
			return got, errors.Join(errors.New("ack"), err)
		}
		if aerr != nil {
			return got, aerr
		}
	}
}
