package gateway

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/identity"
)

// The interceptor chain, outermost first:
//
//	observe   metrics and one log line per call (never bodies: they can carry secrets)
//	recover   a panic becomes Internal, the stack goes to the log
//	status    domain errors become gRPC statuses (status.go)
//	limit     the caller's share and a slot of the in-flight pool (limit.go)
//	validate  malformed requests stop here with InvalidArgument, recorded
//	          in the audit log (audit.go recordInvalid); a call gets the
//	          slot its typed scope is kept in (describe.go)
//	authz     the caller's SPIFFE ID and the request go to policy; refusals
//	          are recorded in the audit log (audit.go)
//	audit     state-changing calls are recorded before they change anything
//
// so that nothing reaches a handler unvalidated or unauthorized.

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// agentsRefused counts the target agent streams refused because the
	// target already has a live one: a second agent of one target (a
	// second instance, a stolen target SVID) shows here, by target.
	agentsRefused *prometheus.CounterVec
	// redecisions counts what re-decisions after a change did to active
	// grants: revoked, or required to renew (must_renew).
	redecisions *prometheus.CounterVec
	// overShare counts the calls refused over their caller's share of the
	// in-flight pool (limit.go), by bound and the caller's role.
	overShare *prometheus.CounterVec
	// keyAge is, per data class and key (access_root, kek), the oldest
	// key's age at the last compliance attestation.
	keyAge *prometheus.GaugeVec
}

func (m *metrics) redecided(revoked, mustRenew int) {
	m.redecisions.WithLabelValues("revoked").Add(float64(revoked))
	m.redecisions.WithLabelValues("must_renew").Add(float64(mustRenew))
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nvmegate", Name: "grpc_requests_total",
			Help: "gRPC requests handled, by method and status code.",
		}, []string{"method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "nvmegate", Name: "grpc_request_duration_seconds",
			Help:    "Time to answer a gRPC request, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"method"}),
		agentsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nvmegate", Name: "target_agent_streams_refused_total",
			Help: "Target agent streams refused because the target already has a live agent stream (a second agent of one target), by target.",
		}, []string{"target"}),
		redecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nvmegate", Name: "grants_redecided_total",
			Help: "Active grants a change (a policy revision, an inventory, binding or job change) re-decided and acted on, by outcome: revoked, must_renew.",
		}, []string{"outcome"}),
		overShare: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nvmegate", Name: "grpc_calls_over_share_total",
			Help: "Calls refused ResourceExhausted because their caller already had its share of the in-flight calls under way, by bound (identity: the caller's own share; role: its role's) and the caller's role.",
		}, []string{"bound", "role"}),
		keyAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "nvmegate", Name: "key_age_max_seconds",
			Help: "Age of the oldest current key of a data class's namespaces (access_root, kek), as of the last compliance attestation.",
		}, []string{"class", "key"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency, m.agentsRefused, m.redecisions, m.overShare, m.keyAge} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

func (s *Server) unaryInterceptors() []grpc.UnaryServerInterceptor {
	return []grpc.UnaryServerInterceptor{
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			start := s.now()
			resp, err := h(ctx, req)
			s.observe(ctx, info.FullMethod, start, err)
			return resp, err
		},
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
			defer s.recoverTo(ctx, info.FullMethod, &err)
			return h(ctx, req)
		},
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			return resp, toStatus(ctx, s.log, info.FullMethod, err)
		},
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			sh, err := s.limit.acquire(ctx)
			if err != nil {
				return nil, err
			}
			defer s.limit.release(sh) // also when the handler panics
			return h(ctx, req)
		},
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if opensAccess[info.FullMethod] {
				// Before policy decides: a re-decision after a change
				// waits for it (Server.Redecide).
				seq := s.openings.enter()
				defer s.openings.exit(seq)
			}
			err := expandHostlists(ctx, req)
			if err == nil {
				err = validate(req, s.now())
			}
			if err != nil {
				s.recordInvalid(ctx, info.FullMethod, err)
				return nil, err
			}
			if s.barrier != nil {
				// A replica decides on the latest state, not on what its
				// copy had applied when the call came (fail closed).
				if err := s.barrier(ctx); err != nil {
					return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "this replica cannot read the latest state of the replicated store (%v); retry", err)
				}
			}
			return h(withScopeSlot(ctx), req)
		},
		authz.UnaryServerInterceptor(s.authorizer, s.describe, s.log,
			authz.WithPeerID(identity.PeerID), authz.WithRefusalRecorder(s.recordRefusal), authz.WithScope(s.policyScope)),
		s.auditChanges,
	}
}

// StreamBarrierTimeout bounds the read barrier a stream passes when it
// opens.
const StreamBarrierTimeout = 5 * time.Second

func (s *Server) streamInterceptors() []grpc.StreamServerInterceptor {
	return []grpc.StreamServerInterceptor{
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			start := s.now()
			err := h(srv, ss)
			s.observe(ss.Context(), info.FullMethod, start, err)
			return err
		},
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
			defer s.recoverTo(ss.Context(), info.FullMethod, &err)
			return toStatus(ss.Context(), s.log, info.FullMethod, h(srv, ss))
		},
		// A stream's request arrives with the handler's first RecvMsg, after
		// the stream is authorized: policy decides on the RPC and caller
		// alone (no stream of ours takes a request policy needs to see), and
		// every received message is validated before the handler gets it.
		authz.StreamServerInterceptor(s.authorizer, s.describe, s.log,
			authz.WithPeerID(identity.PeerID), authz.WithRefusalRecorder(s.recordRefusal)),
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if s.barrier != nil {
				// As for a unary call: a stream's first answer (a target's
				// whole state) comes from the latest state, never from a
				// copy that has lost the others' changes (fail closed).
				// Bounded: a stream has no deadline of its own, and a
				// replica cut off from etcd would hold the agent here
				// instead of letting it go to another replica.
				ctx, cancel := context.WithTimeout(ss.Context(), StreamBarrierTimeout)
				err := s.barrier(ctx)
				cancel()
				if err != nil {
					return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "this replica cannot read the latest state of the replicated store (%v); retry, or reconnect to another replica", err)
				}
			}
			return h(srv, ss)
		},
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &validatingStream{ServerStream: ss, s: s, method: info.FullMethod})
		},
	}
}

// validatingStream validates every message a handler receives, and records
// the malformed ones as the unary interceptor does.
type validatingStream struct {
	grpc.ServerStream
	s      *Server
	method string
}

func (v *validatingStream) RecvMsg(m any) error {
	if err := v.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	err := validate(m, v.s.now())
	if err != nil {
		v.s.recordInvalid(v.Context(), v.method, err)
	}
	return err
}

func (s *Server) recoverTo(ctx context.Context, method string, err *error) {
	if r := recover(); r != nil {
		s.log.ErrorContext(ctx, "panic in handler", "method", method, "panic", r, "stack", string(debug.Stack()))
		*err = status.Error(codes.Internal, "internal error")
	}
}

func (s *Server) observe(ctx context.Context, method string, start time.Time, err error) {
	code := status.Code(err)
	s.metrics.requests.WithLabelValues(method, code.String()).Inc()
	d := s.now().Sub(start)
	s.metrics.latency.WithLabelValues(method).Observe(d.Seconds())
	attrs := []any{"method", method, "code", code.String(), "duration", d}
	if id, ok := identity.PeerID(ctx); ok {
		attrs = append(attrs, "caller", id.String())
	}
	level := slog.LevelDebug
	switch code {
	case codes.OK, codes.NotFound, codes.AlreadyExists, codes.InvalidArgument, codes.Unimplemented:
	case codes.ResourceExhausted:
		// A caller over its share (limit.go): counted by caller role in
		// nvmegate_grpc_calls_over_share_total. A line each at info would
		// let one identity's flood of refused calls write the log.
	case codes.Internal, codes.Unknown, codes.DataLoss:
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	if err != nil {
		// Status messages are built to be caller-safe, so they hold no
		// secret of ours; a refused request's message quotes what the
		// caller sent, which stays out of the log.
		msg := status.Convert(err).Message()
		if code == codes.InvalidArgument {
			msg = nvmegate.WithholdQuoted(msg)
		}
		attrs = append(attrs, "error", msg)
	}
	s.log.Log(ctx, level, "rpc", attrs...)
}
