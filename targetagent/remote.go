package targetagent

import (
	"cmp"
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

// ErrStaleReplica is why a remote agent leaves a gateway replica: it sent a
// state (or a heartbeat) of a store revision older than one the agent has
// already applied — a replica lagging behind the others — or fell silent.
// The agent moves to the next replica.
var ErrStaleReplica = errors.New("targetagent: the gateway replica is behind what this agent applied, or silent; moving to another")

// DefaultSilence is how long a stream that sends heartbeats may go
// without a message before the agent drops it: three of the gateway's
// heartbeats (HeartbeatInterval).
const DefaultSilence = 3 * HeartbeatInterval

// HeartbeatInterval is how often the gateway sends a heartbeat on a
// target agent's stream, while its replica passes the read barrier.
const HeartbeatInterval = 2 * time.Second

// Remote is the agent side of a target on its own storage server
// (cmd/nvmegate-target): it streams the target's desired state from the
// gateway — whole, then deltas — applies each generation in order with the
// local driver and acknowledges it; it reconnects with backoff when the
// stream ends (a gateway restart), to the next replica when there are
// several.
type Remote struct {
	Conn grpc.ClientConnInterface // to the gateway, with the target's SVID
	// Replicas, if set, are one connection to each gateway replica (Conn
	// is then unused). The agent streams from one at a time and moves to
	// the next when the stream ends, is refused, falls silent past Silence,
	// or brings a state older than one already applied.
	Replicas []grpc.ClientConnInterface
	Driver   Driver
	Log      *slog.Logger
	// Applied, if set, is told of every generation applied, or refused
	// (for tests and status); one applied except namespaces the target
	// cannot serve comes with its *fabric.NotServedError.
	Applied func(gen uint64, err error)
	// Silence bounds the time between two messages of a stream that sends
	// heartbeats; past it the agent drops the stream (its replica hangs,
	// or cannot read the latest state) and moves on. Default
	// DefaultSilence.
	Silence time.Duration

	stream   atomic.Value  // string: the ID of the live stream, for Reencrypted
	live     atomic.Int64  // index of the replica the live stream is on
	revision atomic.Uint64 // the highest store revision of a state applied and acknowledged
}

// conns are the connections the agent streams over, in turn.
func (r *Remote) conns() []grpc.ClientConnInterface {
	if len(r.Replicas) > 0 {
		return r.Replicas
	}
	return []grpc.ClientConnInterface{r.Conn}
}

// Revision is the highest store revision of a state this agent applied
// and acknowledged (0: none yet, or the gateway sends none).
func (r *Remote) Revision() uint64 { return r.revision.Load() }

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
	cs := r.conns()
	_, err := pb.NewTargetAgentClient(cs[int(r.live.Load())%len(cs)]).Reencrypted(ctx, &pb.ReencryptedRequest{SubsystemNqn: sub, Nsid: nsid,
		Generation: gen, Error: msg, StreamId: id})
	return err
}

// ackTimeout bounds an acknowledgement: a replica that hangs mid-call is
// left, not waited for until the connection's keepalive gives up.
const ackTimeout = 10 * time.Second

// stuckExported reports whether a namespace not served is still exported
// (the target could not take it down).
func stuckExported(ns []fabric.NotServed) bool {
	for _, n := range ns {
		if n.Exported {
			return true
		}
	}
	return false
}

// Run works until ctx ends.
func (r *Remote) Run(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cs := r.conns()
	backoff := 100 * time.Millisecond
	for i := 0; ; i = (i + 1) % len(cs) {
		r.live.Store(int64(i))
		got, err := r.once(ctx, log, cs[i])
		if got {
			backoff = 100 * time.Millisecond // a healthy stream: start over
		}
		if ctx.Err() != nil {
			return nil
		}
		if len(cs) > 1 && (got || i < len(cs)-1) {
			// Another replica may serve at once: wait only once every
			// replica was tried without a state.
			log.Warn("target agent: stream ended; moving to the next gateway replica", "err", err, "replica", (i+1)%len(cs))
			continue
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
// stream is dropped and the next one starts with the whole state. A state
// of a store revision older than one applied before, on any stream, is
// refused: it comes from a replica that has not seen a change this agent
// already applied (a released host would come back).
func (r *Remote) once(ctx context.Context, log *slog.Logger, conn grpc.ClientConnInterface) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx) // ends the stream when this returns
	defer cancel()
	c := pb.NewTargetAgentClient(conn)
	stream, err := c.Watch(ctx, &pb.WatchRequest{AcceptDeltas: true, AcceptHeartbeats: true})
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
	silence := cmp.Or(r.Silence, DefaultSilence)
	// The first message is due within a few silences (a gateway that
	// beats sends a heartbeat at once; one from before heartbeats, its
	// first state); after it, the bound holds only once the gateway has
	// beaten: one from before heartbeats sends none, and its stream may be
	// quiet for as long as nothing changes.
	bound := 5 * silence
	timer := time.NewTimer(bound)
	defer timer.Stop()
	quiet := timer.C
	var (
		applied uint64
		have    bool // applied holds a generation applied on this stream
		beats   bool // the gateway sent a heartbeat: it knows not_served
	)
	for {
		var m *pb.WatchResponse
		select {
		case m = <-msgs:
		case <-quiet:
			return got, fmt.Errorf("no message for %s: %w", bound, ErrStaleReplica)
		case <-ctx.Done():
			select {
			case err := <-ended:
				return got, err
			default:
				return got, ctx.Err()
			}
		}
		beats = beats || m.Heartbeat
		if beats {
			timer.Reset(silence)
			quiet, bound = timer.C, silence
		} else {
			timer.Stop()
			quiet = nil
		}
		if acked := r.revision.Load(); acked > 0 && m.StoreRevision < acked {
			// Not applied, and not acknowledged: the replica is behind.
			err := fmt.Errorf("state of store revision %d, older than revision %d applied before: %w", m.StoreRevision, acked, ErrStaleReplica)
			if !m.Heartbeat && r.Applied != nil {
				r.Applied(m.Generation, err)
			}
			return got, err
		}
		if m.Heartbeat {
			continue
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
		// Namespaces the target cannot serve (fabric.NotServedError) do
		// not fail the generation: the driver applied the rest and holds
		// it, and the acknowledgement lists them.
		notServed, partial := fabric.NotServedIn(aerr)
		applied, have = gen, aerr == nil || partial
		msg := ""
		switch {
		case partial && !beats && stuckExported(notServed):
			// A namespace that could not be taken down is a removal not
			// done. A gateway from before not_served (it sends no
			// heartbeats either) would read the list-only acknowledgement
			// as applied, and could crypto-erase under an open mapping:
			// it is told the generation failed.
			msg = aerr.Error()
			log.Error("target agent: generation not applied: a namespace could not be taken down", "generation", gen, "err", aerr)
		case partial:
			log.Warn("target agent: generation applied, except namespaces this target cannot serve (not exported)", "generation", gen, "err", aerr)
		case aerr != nil:
			msg = aerr.Error()
			log.Error("target agent: generation not applied", "generation", gen, "err", aerr)
		}
		if r.Applied != nil {
			r.Applied(gen, aerr)
		}
		// A refused acknowledgement (the gateway ended this stream: it
		// took too long) drops the stream too; so does a failed
		// application, which the gateway answers by ending the stream.
		actx, acancel := context.WithTimeout(ctx, ackTimeout)
		_, err := c.Ack(actx, &pb.AckRequest{Generation: gen, Error: msg, StreamId: m.StreamId, NotServed: NotServedToProto(notServed)})
		acancel()
		if err != nil {
			return got, errors.Join(errors.New("ack"), err)
		}
		if aerr != nil && (!partial || msg != "") {
			return got, aerr
		}
		for acked := r.revision.Load(); u.Revision > acked && !r.revision.CompareAndSwap(acked, u.Revision); acked = r.revision.Load() {
		}
		if beats {
			// The silence is the gateway's, not the time this agent took
			// to apply: what queued meanwhile is read first.
			timer.Reset(silence)
		}
	}
}
