package gateway

import (
	"context"
	"log/slog"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/fabric"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// TargetHub connects remote target agents (targetagent.Hub).
type TargetHub interface {
	Subscribe(targetID string) (<-chan fabric.State, func())
	Ack(targetID string, gen uint64, errMsg string)
}

// targetAgentService streams each target agent its own target's desired
// state. Policy has checked that the caller is a target agent; the target
// is always the caller's own (its SVID's name), so an agent can read
// nothing else, whatever it asks.
type targetAgentService struct {
	pb.UnimplementedTargetAgentServer
	store    InventoryStore
	hub      TargetHub
	targets  TargetProgrammer
	stopping <-chan struct{} // the gateway is shutting down
	log      *slog.Logger
}

func (s *targetAgentService) own(ctx context.Context) (*nvmegate.Target, error) {
	c, ok := authz.CallerFromContext(ctx)
	if !ok || c.Role != "target" || c.Name == "" {
		return nil, nvmegate.Errorf(nvmegate.EPERMISSION, "only a target agent may do this")
	}
	return s.store.Target(ctx, c.Name)
}

func (s *targetAgentService) Watch(_ *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	ctx := stream.Context()
	t, err := s.own(ctx)
	if err != nil {
		return err
	}
	states, cancel := s.hub.Subscribe(t.ID)
	defer cancel()
	// The first state comes the way every later one does: from a
	// programming run, which runs one at a time per target. A state built
	// here, beside a run in flight, could reach the agent after a newer
	// one — and allow a host revoked in between until the next run.
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
		case st := <-states:
			if err := stream.Send(targetagent.StateToProto(t.ID, st)); err != nil {
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
	s.hub.Ack(t.ID, r.Generation, r.Error)
	return &pb.AckResponse{}, nil
}
