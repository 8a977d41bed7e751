package gateway

import (
	"context"

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

// TargetStates builds a target's desired state (targetagent.Agent).
type TargetStates interface {
	State(ctx context.Context, t *nvmegate.Target) (fabric.State, error)
}

// targetAgentService streams each target agent its own target's desired
// state. Policy has checked that the caller is a target agent; the target
// is always the caller's own (its SVID's name), so an agent can read
// nothing else, whatever it asks.
type targetAgentService struct {
	pb.UnimplementedTargetAgentServer
	store    InventoryStore
	hub      TargetHub
	states   TargetStates
	stopping <-chan struct{} // the gateway is shutting down
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
	st, err := s.states.State(ctx, t)
	if err != nil {
		return err
	}
	for {
		if err := stream.Send(targetagent.StateToProto(t.ID, st)); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "the gateway is shutting down; reconnect")
		case st = <-states:
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
