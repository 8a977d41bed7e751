package gateway

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// TargetProgrammer makes a target allow exactly the hosts its active
// grants name (targetagent.Agent; the lease programs it for grants).
// Program's changed are the host entries whose grants the caller stored a
// change of (every one, or the target does not hear of it until the next
// whole run); none programs the whole target. InventoryChanged says the
// target's subsystems, namespaces or ports changed: its next run is whole.
type TargetProgrammer interface {
	Program(ctx context.Context, targetID string, changed ...targetagent.HostRef) error
	InventoryChanged(targetID string)
}

// TargetHub connects remote target agents (targetagent.Agent over its
// Hub): one live stream per target, and none for a target the gateway
// programs itself.
type TargetHub interface {
	Subscribe(t *nvmegate.Target, deltas bool) (*targetagent.Subscription, error)
	Ack(targetID, stream string, gen uint64, errMsg string) error
}

// targetAgentService streams each target agent its own target's desired
// state: whole at first, then changes (deltas to an agent that accepts
// them, whole states to one that does not). Policy has checked that the caller is a target agent; the target
// is always the caller's own (its SVID's name), so an agent can read
// nothing else, whatever it asks.
type targetAgentService struct {
	pb.UnimplementedTargetAgentServer
	store    InventoryStore
	hub      TargetHub
	targets  TargetProgrammer
	stopping <-chan struct{} // the gateway is shutting down
	log      *slog.Logger
	refused  *prometheus.CounterVec // streams refused for a live one, by target
}

func (s *targetAgentService) own(ctx context.Context) (*nvmegate.Target, error) {
	c, ok := authz.CallerFromContext(ctx)
	if !ok || c.Role != "target" || c.Name == "" {
		return nil, nvmegate.Errorf(nvmegate.EPERMISSION, "only a target agent may do this")
	}
	return s.store.Target(ctx, c.Name)
}

func (s *targetAgentService) Watch(r *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	ctx := stream.Context()
	t, err := s.own(ctx)
	if err != nil {
		return err
	}
	sub, err := s.hub.Subscribe(t, r.AcceptDeltas)
	if err != nil {
		// Another agent of this target is live (this one retries, and
		// gets in once that stream ends), or the gateway programs the
		// target itself.
		if errors.Is(err, targetagent.ErrAgentConnected) {
			s.refused.WithLabelValues(t.ID).Inc()
			s.log.WarnContext(ctx, "a second agent of a target refused: its agent stream is live", "target", t.ID)
		}
		return nvmegate.Errorf(nvmegate.ECONFLICT, "%v", err)
	}
	defer sub.Close()
	// The first state comes the way every later one does: from a
	// programming run, which runs one at a time per target (a new stream
	// gets the whole state). A state built here, beside a run in flight,
	// could reach the agent after a newer one — and allow a host revoked
	// in between until the next run.
	go func() {
		if err := s.targets.Program(ctx, t.ID); err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "target agent connected, its first state not applied; the reconciler retries", "target", t.ID, "err", err)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "the gateway is shutting down; reconnect")
		case <-sub.Ended():
			// The hub ended the stream (no acknowledgement in time, a
			// failed application): the agent reconnects and starts over.
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "target %s: stream ended: %v; reconnect", t.ID, sub.Err())
		case u := <-sub.Updates():
			m := targetagent.UpdateToProto(t.ID, u)
			m.StreamId = sub.ID()
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (s *targetAgentService) Ack(ctx context.Context, r *pb.AckRequest) (*pb.AckResponse, error) {
	t, err := s.own(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.hub.Ack(t.ID, r.StreamId, r.Generation, agentError(r.Error)); err != nil {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "%v", err)
	}
	return &pb.AckResponse{}, nil
}

// agentError is what the gateway keeps of an agent's error text, which ends
// up in log lines: a message that looks like key material (a driver that
// echoed a secret it could not install) is withheld, and one with control,
// format or separator characters is quoted, so that it cannot forge or hide
// log lines. The ack itself is taken either way: refusing it would leave
// the generation to time out, and the agent did report a failure.
func agentError(msg string) string {
	switch {
	case msg == "":
		return ""
	case nvmegate.LooksLikeKeyMaterial(msg):
		return "(the agent's message is withheld: it looks like key material)"
	case nvmegate.ValidateString("error", msg) != nil:
		return strconv.Quote(msg)
	}
	return msg
}
