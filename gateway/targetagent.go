package gateway

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
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
	// Ack's notServed are the namespaces a generation was applied
	// without (fabric.NotServedError): it counts as applied otherwise.
	Ack(targetID, stream string, gen uint64, errMsg string, notServed ...fabric.NotServed) error
	Live(targetID, stream string) bool
}

// DataKeyCommitter commits a data-key rotation a target re-encrypted a
// namespace for (keys.Manager).
type DataKeyCommitter interface {
	CommitDataKeyRotation(ctx context.Context, namespace string, gen uint64, reason string) (keys.Wrapped, error)
	DataKeyOwner(ctx context.Context, namespace string) (owner string, found bool, err error)
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
	keys     DataKeyCommitter       // nil: re-encryption reports are refused
	// barrier, for one of several replicas, brings this replica's copy of
	// the store up to the latest state (Config.ReadBarrier); nil for one
	// gateway.
	barrier func(context.Context) error
	// heartbeat is the interval of heartbeats to agents that take them
	// (targetagent.HeartbeatInterval).
	heartbeat time.Duration
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
	lost := s.watchBarrier(ctx)
	var beat <-chan time.Time
	if r.AcceptHeartbeats {
		tick := time.NewTicker(cmp.Or(s.heartbeat, targetagent.HeartbeatInterval))
		defer tick.Stop()
		beat = tick.C
		// One at once: the agent learns from the start that this gateway
		// beats (and at which revision its copy is), so it can leave it if
		// it hangs even before its first state.
		if err := stream.Send(&pb.WatchResponse{TargetId: t.ID, StreamId: sub.ID(), Heartbeat: true, StoreRevision: s.store.Revision()}); err != nil {
			return err
		}
	}
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
		case err := <-lost:
			// This replica cannot read the latest state: the agent moves
			// to another rather than wait here for changes this copy will
			// not see.
			return err
		case <-beat:
			// A heartbeat says this replica is alive, and at which
			// revision its copy is (an agent that applied a later one
			// leaves at once).
			if err := stream.Send(&pb.WatchResponse{TargetId: t.ID, StreamId: sub.ID(), Heartbeat: true, StoreRevision: s.store.Revision()}); err != nil {
				return err
			}
		case u := <-sub.Updates():
			m := targetagent.UpdateToProto(t.ID, u)
			m.StreamId = sub.ID()
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

// current passes the read barrier within a heartbeat's interval, or says
// why the stream ends.
// watchBarrier passes the read barrier every heartbeat interval while the
// stream lasts, each bounded by StreamBarrierTimeout (longer than one
// read attempt on one etcd member, so a member that hangs is retried on
// another within it), and says on the channel why the stream ends once
// one fails. Apart from the heartbeats: a slow barrier must not silence
// them, or every agent of the replica would leave at once.
func (s *targetAgentService) watchBarrier(ctx context.Context) <-chan error {
	lost := make(chan error, 1)
	if s.barrier == nil {
		return lost
	}
	go func() {
		tick := time.NewTicker(cmp.Or(s.heartbeat, targetagent.HeartbeatInterval))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			bctx, cancel := context.WithTimeout(ctx, StreamBarrierTimeout)
			err := s.barrier(bctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				lost <- nvmegate.Errorf(nvmegate.EUNAVAILABLE, "this replica cannot read the latest state of the replicated store (%v); reconnect to another replica", err)
				return
			}
		}
	}()
	return lost
}

func (s *targetAgentService) Ack(ctx context.Context, r *pb.AckRequest) (*pb.AckResponse, error) {
	t, err := s.own(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.hub.Ack(t.ID, r.StreamId, r.Generation, agentError(r.Error), notServed(r.NotServed)...); err != nil {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "%v", err)
	}
	return &pb.AckResponse{}, nil
}

// maxNotServed bounds the namespaces one acknowledgement reports: what the
// gateway keeps of them is checked against the state it sent (an agent
// speaks of its own target's namespaces only), and an agent cannot make it
// keep more than that.
const maxNotServed = 1024

// notServed is what the gateway keeps of an agent's report of namespaces
// not served: at most maxNotServed, their reasons as agentError keeps an
// agent's error text.
func notServed(ps []*pb.NamespaceNotServed) []fabric.NotServed {
	if len(ps) == 0 {
		return nil
	}
	// Those still exported first: they decide whether the generation
	// counts as applied, and are kept before any other.
	ps = slices.Clone(ps)
	slices.SortStableFunc(ps, func(a, b *pb.NamespaceNotServed) int {
		switch {
		case a.Exported == b.Exported:
			return 0
		case a.Exported:
			return -1
		}
		return 1
	})
	out := make([]fabric.NotServed, 0, min(len(ps), maxNotServed))
	for i, p := range ps {
		if i >= maxNotServed {
			break // those still exported came first: one is enough to fail the generation
		}
		why := agentError(p.Reason)
		if why == "" {
			why = "(no reason given)"
		}
		sub := p.SubsystemNqn
		if sub != "" && nvmegate.ValidateString("subsystem", sub) != nil {
			sub = nvmegate.Quote(sub) // names no subsystem of the state: dropped, logged escaped
		}
		out = append(out, fabric.NotServed{Subsystem: sub, NSID: p.Nsid, Reason: why, Exported: p.Exported})
	}
	return out
}

// Reencrypted takes a target agent's report that a namespace of its own
// target is re-encrypted to generation gen: the rotation is committed (the
// previous data key destroyed, recorded by the key manager) and the
// target is programmed to export the namespace again under the new key.
// A failure report changes nothing: the job resumes at the next state.
func (s *targetAgentService) Reencrypted(ctx context.Context, r *pb.ReencryptedRequest) (*pb.ReencryptedResponse, error) {
	t, err := s.own(ctx)
	if err != nil {
		return nil, err
	}
	if s.keys == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no data keys")
	}
	if !s.hub.Live(t.ID, r.StreamId) {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "target %s: not its live stream; the report counts for nothing", t.ID)
	}
	// The namespace must be one of the caller's own target; another
	// target's reads as absent.
	sub, err := s.store.Subsystem(ctx, r.SubsystemNqn)
	if err == nil && sub.TargetID != t.ID {
		err = nvmegate.Errorf(nvmegate.ENOTFOUND, "subsystem %s not found", r.SubsystemNqn)
	}
	if err != nil {
		return nil, err
	}
	n, err := s.store.Namespace(ctx, r.SubsystemNqn, r.Nsid)
	if err != nil {
		return nil, err
	}
	if r.Error != "" {
		s.log.ErrorContext(ctx, "target agent: re-encryption stopped; it resumes at the target's next state", "target", t.ID,
			"subsystem", r.SubsystemNqn, "nsid", r.Nsid, "generation", r.Generation, "err", agentError(r.Error))
		return &pb.ReencryptedResponse{}, nil
	}
	name := NamespaceKeyName(r.SubsystemNqn, r.Nsid)
	// Only this namespace record's key: one a removed record left under
	// the name is never committed (nor its previous generation destroyed)
	// on a report for this one.
	if owner, found, err := s.keys.DataKeyOwner(ctx, name); err != nil {
		return nil, keyErr(err)
	} else if found && owner != n.Incarnation {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "the data key stored for namespace %d of %s belongs to another namespace record; the report counts for nothing", r.Nsid, r.SubsystemNqn)
	}
	if _, err := s.keys.CommitDataKeyRotation(ctx, name, r.Generation, "re-encrypted by target "+t.ID); err != nil {
		if errors.Is(err, keys.ErrConflict) {
			return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "namespace %d of %s has no re-encryption to generation %d under way", r.Nsid, r.SubsystemNqn, r.Generation)
		}
		return nil, keyErr(err)
	}
	s.targets.InventoryChanged(t.ID)
	// The new state goes out on the stream; the agent is not waited for
	// here (its stream loop answers while this call is in flight).
	go func() {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := s.targets.Program(pctx, t.ID); err != nil {
			s.log.Warn("re-encrypted namespace not yet exported again; the reconciler retries", "target", t.ID, "err", err)
		}
	}()
	return &pb.ReencryptedResponse{}, nil
}

// agentError is what the gateway keeps of an agent's error text, which ends
// up in log lines: a message that looks like key material (a driver that
// echoed a secret it could not install) is withheld, and one with control,
// format, separator or default-ignorable characters is quoted with them
// escaped (nvmegate.Quote), so that it cannot forge or hide log lines. The ack itself is taken either way: refusing it would leave
// the generation to time out, and the agent did report a failure.
func agentError(msg string) string {
	switch {
	case msg == "":
		return ""
	case nvmegate.LooksLikeKeyMaterial(msg):
		return "(the agent's message is withheld: it looks like key material)"
	case nvmegate.ValidateString("error", msg) != nil:
		return nvmegate.Quote(msg)
	}
	return msg
}
