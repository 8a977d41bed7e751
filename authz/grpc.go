package authz

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
)

// DescribeFunc tells the interceptors what a request is about before it is
// authorized: the action (e.g. "inventory.add_target"; "" for the default,
// ActionFromMethod) and the resource document policy sees as
// input.resource (the records involved, e.g. the namespaces and their
// tenants and regions). For streams req is nil.
//
// It runs before authorization, for callers who may be denied: it must not
// modify anything, and an error it returns reaches the caller. An error that
// is a gRPC status is returned as is; any other becomes InvalidArgument
// with the message of an *nvmegate.Error, or "invalid request".
type DescribeFunc func(ctx context.Context, fullMethod string, req any) (action string, resource map[string]any, err error)

// InterceptorOption configures the interceptors.
type InterceptorOption func(*guard)

// WithPeerID replaces how the interceptors find the caller's SPIFFE ID. The
// default, grpccredentials.PeerIDFromContext, matches go-spiffe's own
// credentials; a server using identity.ServerCredentials must pass
// identity.PeerID (the gateway does). The function must only return IDs
// verified in the mTLS handshake: whatever it returns is the caller.
func WithPeerID(f func(ctx context.Context) (spiffeid.ID, bool)) InterceptorOption {
	return func(g *guard) { g.peerID = f }
}

// RefusalRecorder records a call that authorization refuses (a denial, or
// a decision that failed) before the caller is answered; the gateway
// appends it to the audit log. d may be nil when no decision could be made.
// in's resource may be typed (Input.Scope, no Resource): read it with
// in.ResourceMap. An error is logged and the call stays refused.
type RefusalRecorder func(ctx context.Context, in *Input, d *nvmegate.Decision, err error) error

// WithRefusalRecorder has the interceptors call r for every refused call
// except those whose context ended.
func WithRefusalRecorder(r RefusalRecorder) InterceptorOption {
	return func(g *guard) { g.record = r }
}

// UnaryServerInterceptor authorizes every unary call with a:
//
//   - no verified SPIFFE ID on the connection: codes.Unauthenticated;
//   - describe fails: its status, or codes.InvalidArgument (see DescribeFunc);
//   - a denies: codes.PermissionDenied, "permission denied: <reasons>; decision <id>";
//   - a fails (an error): codes.Internal, "authorization failed; decision <id>",
//     or the context's code (Canceled, DeadlineExceeded) if the call ended;
//   - a allows: the handler runs with the Caller and the Decision in its
//     context (CallerFromContext, DecisionFromContext).
//
// describe may be nil (default action, empty resource). Every decision is
// logged to log (nil discards): allows at debug, denials at info, failures at
// error, with the decision ID, caller, method, outcome and reasons; never a
// request body.
func UnaryServerInterceptor(a Authorizer, describe DescribeFunc, log *slog.Logger, opts ...InterceptorOption) grpc.UnaryServerInterceptor {
	g := newGuard(a, describe, log, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := g.check(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: it
// authorizes once, when the stream opens (describe gets a nil req), and the
// handler's stream context carries the Caller and the Decision.
func StreamServerInterceptor(a Authorizer, describe DescribeFunc, log *slog.Logger, opts ...InterceptorOption) grpc.StreamServerInterceptor {
	g := newGuard(a, describe, log, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := g.check(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &authorizedStream{ServerStream: ss, ctx: ctx})
	}
}

type authorizedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authorizedStream) Context() context.Context { return s.ctx }

// guard is the shared logic of both interceptors.
type guard struct {
	a        Authorizer
	describe DescribeFunc
	log      *slog.Logger
	peerID   func(context.Context) (spiffeid.ID, bool)
	record   RefusalRecorder // nil records nothing
	scope    func(context.Context) *Scope
}

// WithScope gives the interceptors the typed resource of a call
// (Input.Scope) after its description: f returns the scope the
// DescribeFunc read for the call, or nil. The DescribeFunc may then
// return a nil resource (the engine reads Scope alone; Input.ResourceMap
// builds the map for whoever needs it); if it returns one, it must
// describe the same records.
func WithScope(f func(ctx context.Context) *Scope) InterceptorOption {
	return func(g *guard) { g.scope = f }
}

func newGuard(a Authorizer, describe DescribeFunc, log *slog.Logger, opts []InterceptorOption) *guard {
	if a == nil {
		panic("authz: nil Authorizer")
	}
	g := &guard{a: a, describe: describe, log: log, peerID: grpccredentials.PeerIDFromContext}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

// check authorizes one call and returns the context for the handler, or the
// status error to return to the caller.
func (g *guard) check(ctx context.Context, fullMethod string, req any) (context.Context, error) {
	id, ok := g.peerID(ctx)
	if !ok || id.IsZero() {
		g.log.LogAttrs(ctx, slog.LevelInfo, "authz: unauthenticated call", slog.String("method", fullMethod))
		return nil, status.Error(codes.Unauthenticated, "no verified SPIFFE ID")
	}
	caller := ParseCaller(id)

	var action string
	var resource map[string]any
	if g.describe != nil {
		var err error
		if action, resource, err = g.describe(ctx, fullMethod, req); err != nil {
			g.log.LogAttrs(ctx, slog.LevelInfo, "authz: describe failed",
				slog.String("caller", caller.ID), slog.String("method", fullMethod), slog.String("error", nvmegate.WithholdQuoted(err.Error())))
			return nil, describeStatus(err)
		}
	}

	in := NewInput(caller, fullMethod, action, resource)
	if g.scope != nil {
		in.Scope = g.scope(ctx)
	}
	d, err := g.a.Authorize(ctx, in)
	switch {
	case err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		g.logDecision(ctx, slog.LevelInfo, caller, fullMethod, d, err)
		return nil, status.FromContextError(err).Err()
	case errors.Is(err, ErrHeld):
		g.logDecision(ctx, slog.LevelError, caller, fullMethod, d, err)
		g.recordRefusal(ctx, in, d, err)
		return nil, status.Errorf(codes.Unavailable, "this gateway replica cannot load the policy in force, and decides nothing; decision %s", d.ID)
	case err != nil:
		g.logDecision(ctx, slog.LevelError, caller, fullMethod, d, err)
		g.recordRefusal(ctx, in, d, err)
		if d == nil {
			return nil, status.Error(codes.Internal, "authorization failed")
		}
		return nil, status.Errorf(codes.Internal, "authorization failed; decision %s", d.ID)
	case d == nil:
		err := errors.New("authorizer returned no decision")
		g.logDecision(ctx, slog.LevelError, caller, fullMethod, d, err)
		g.recordRefusal(ctx, in, d, err)
		return nil, status.Error(codes.Internal, "authorization failed")
	case !d.Allow:
		g.logDecision(ctx, slog.LevelInfo, caller, fullMethod, d, nil)
		g.recordRefusal(ctx, in, d, nil)
		reasons := strings.Join(d.Reasons, "; ")
		if reasons == "" {
			reasons = "denied by policy"
		}
		return nil, status.Errorf(codes.PermissionDenied, "permission denied: %s; decision %s", reasons, d.ID)
	}
	g.logDecision(ctx, slog.LevelDebug, caller, fullMethod, d, nil)
	return context.WithValue(ctx, contextKey{}, &authorized{caller: caller, decision: d, input: in}), nil
}

func (g *guard) recordRefusal(ctx context.Context, in *Input, d *nvmegate.Decision, err error) {
	if g.record == nil {
		return
	}
	if rerr := g.record(ctx, in, d, err); rerr != nil {
		attrs := []slog.Attr{slog.String("caller", in.Caller.ID), slog.String("method", in.RPC.FullMethod), slog.Any("error", rerr)}
		if d != nil {
			attrs = append(attrs, slog.String("decision_id", d.ID))
		}
		g.log.LogAttrs(ctx, slog.LevelError, "authz: refusal not recorded", attrs...)
	}
}

func (g *guard) logDecision(ctx context.Context, level slog.Level, c Caller, fullMethod string, d *nvmegate.Decision, err error) {
	if !g.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8)
	if d != nil {
		attrs = append(attrs, slog.String("decision_id", d.ID))
	}
	attrs = append(attrs,
		slog.String("caller", c.ID),
		slog.String("role", c.Role),
		slog.String("method", fullMethod))
	if d != nil {
		attrs = append(attrs,
			slog.Bool("allow", d.Allow && err == nil),
			slog.Any("reasons", d.Reasons),
			slog.String("policy_revision", d.PolicyRevision))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	g.log.LogAttrs(ctx, level, "authz: decision", attrs...)
}

// describeStatus maps a DescribeFunc error to the status the caller sees.
func describeStatus(err error) error {
	if s, ok := status.FromError(err); ok {
		return s.Err()
	}
	var e *nvmegate.Error
	if errors.As(err, &e) {
		return status.Error(codes.InvalidArgument, e.Error())
	}
	return status.Error(codes.InvalidArgument, "invalid request")
}

// authorized is what the interceptors store in a handler's context.
type authorized struct {
	caller   Caller
	decision *nvmegate.Decision
	input    *Input // nil when built by NewContext
}

type contextKey struct{}

// NewContext returns ctx carrying the authorized caller and the decision
// that allowed the call. The interceptors call it; handler tests may too.
func NewContext(ctx context.Context, c Caller, d *nvmegate.Decision) context.Context {
	return context.WithValue(ctx, contextKey{}, &authorized{caller: c, decision: d})
}

// InputFromContext returns the policy input the interceptors authorized
// the call with (the action and the records it is about), for handlers and
// later interceptors that record the call.
func InputFromContext(ctx context.Context) (*Input, bool) {
	a, ok := ctx.Value(contextKey{}).(*authorized)
	if !ok || a.input == nil {
		return nil, false
	}
	return a.input, true
}

// CallerFromContext returns the caller the interceptors authorized.
func CallerFromContext(ctx context.Context) (Caller, bool) {
	a, ok := ctx.Value(contextKey{}).(*authorized)
	if !ok {
		return Caller{}, false
	}
	return a.caller, true
}

// DecisionFromContext returns the decision that allowed the call, for the
// handler to enforce its obligations and record its ID and revision.
func DecisionFromContext(ctx context.Context) (*nvmegate.Decision, bool) {
	a, ok := ctx.Value(contextKey{}).(*authorized)
	if !ok || a.decision == nil {
		return nil, false
	}
	return a.decision, true
}
