package authz_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
)

// The tests run a real gRPC server over bufconn, without TLS. The caller's
// SPIFFE ID travels in a metadata header that a test-only peer-ID function
// reads (WithPeerID); the gateway's tests cover the real mTLS path.
const idHeader = "x-test-spiffe-id"

func headerPeerID(ctx context.Context) (spiffeid.ID, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(idHeader)
	if len(v) != 1 {
		return spiffeid.ID{}, false
	}
	id, err := spiffeid.FromString(v[0])
	return id, err == nil
}

func as(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idHeader, id)
}

// inventory is a stand-in for nvmegate.v1.Inventory with one unary and one
// server-streaming method, registered through a hand-written ServiceDesc
// (structpb messages), so the test needs no generated code.
type inventory struct {
	mu       sync.Mutex
	calls    int
	caller   authz.Caller
	decision *nvmegate.Decision
}

func (s *inventory) seen(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.caller, _ = authz.CallerFromContext(ctx)
	s.decision, _ = authz.DecisionFromContext(ctx)
}

var inventoryDesc = grpc.ServiceDesc{
	ServiceName: "nvmegate.v1.Inventory",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "AddTarget",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, _ any) (any, error) {
				srv.(*inventory).seen(ctx)
				return &structpb.Struct{}, nil
			}
			return ic(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: "/nvmegate.v1.Inventory/AddTarget"}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Watch",
		ServerStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			srv.(*inventory).seen(ss.Context())
			c, _ := authz.CallerFromContext(ss.Context())
			return ss.SendMsg(&structpb.Struct{Fields: map[string]*structpb.Value{"role": structpb.NewStringValue(c.Role)}})
		},
	}},
}

type server struct {
	conn *grpc.ClientConn
	inv  *inventory
	log  *bytes.Buffer
	// describe is called by the interceptors' DescribeFunc if set.
	describe func(ctx context.Context, fullMethod string, req any) (string, map[string]any, error)
	inputs   []*authz.Input // what the authorizer was asked
	mu       sync.Mutex
}

// newServer starts a gRPC server with the real interceptors around a (nil:
// the engine with the embedded policy).
func newServer(t *testing.T, a authz.Authorizer, opts ...authz.InterceptorOption) *server {
	t.Helper()
	if a == nil {
		a, _, _ = newEngine(t, nil)
	}
	s := &server{inv: &inventory{}, log: &bytes.Buffer{}}
	recording := authz.AuthorizerFunc(func(ctx context.Context, in *authz.Input) (*nvmegate.Decision, error) {
		s.mu.Lock()
		s.inputs = append(s.inputs, in)
		s.mu.Unlock()
		return a.Authorize(ctx, in)
	})
	describe := func(ctx context.Context, fullMethod string, req any) (string, map[string]any, error) {
		if s.describe == nil {
			return "", nil, nil
		}
		return s.describe(ctx, fullMethod, req)
	}
	log := slog.New(slog.NewTextHandler(&syncWriter{w: s.log}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(authz.UnaryServerInterceptor(recording, describe, log, opts...)),
		grpc.StreamInterceptor(authz.StreamServerInterceptor(recording, describe, log, opts...)),
	)
	srv.RegisterService(&inventoryDesc, s.inv)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 20)
	go srv.Serve(lis)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
	})
	s.conn = conn
	return s
}

func (s *server) addTarget(ctx context.Context, req *structpb.Struct) error {
	if req == nil {
		req = &structpb.Struct{}
	}
	return s.conn.Invoke(ctx, "/nvmegate.v1.Inventory/AddTarget", req, &structpb.Struct{})
}

func (s *server) watch(ctx context.Context) (*structpb.Struct, error) {
	st, err := s.conn.NewStream(ctx, &inventoryDesc.Streams[0], "/nvmegate.v1.Inventory/Watch")
	if err != nil {
		return nil, err
	}
	if err := st.CloseSend(); err != nil {
		return nil, err
	}
	var m structpb.Struct
	if err := st.RecvMsg(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

func (s *server) lastInput() *authz.Input {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inputs) == 0 {
		return nil
	}
	return s.inputs[len(s.inputs)-1]
}

func wantCode(t *testing.T, err error, code codes.Code, msg string) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), code, msg)
	}
	return st
}

const (
	adminID = "spiffe://example.org/admin/alice"
	nodeID  = "spiffe://example.org/node/gpu-01"
)

var deniedRE = regexp.MustCompile(`^permission denied: no rule allows role node to perform inventory.add_target; decision ([0-9a-f-]{36})$`)

func TestInterceptorUnauthenticated(t *testing.T) {
	// Default peer-ID lookup over a connection without TLS: no SPIFFE ID.
	s := newServer(t, nil)
	ctx := as(context.Background(), adminID) // a header is no identity
	wantCode(t, s.addTarget(ctx, nil), codes.Unauthenticated, "no verified SPIFFE ID")
	_, err := s.watch(ctx)
	wantCode(t, err, codes.Unauthenticated, "no verified SPIFFE ID")
	_, err = healthpb.NewHealthClient(s.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	wantCode(t, err, codes.Unauthenticated, "")

	// With the test lookup, a call without the header has no ID either.
	s = newServer(t, nil, authz.WithPeerID(headerPeerID))
	wantCode(t, s.addTarget(context.Background(), nil), codes.Unauthenticated, "")
	if s.inv.calls != 0 || s.lastInput() != nil {
		t.Error("an unauthenticated call reached the authorizer or the handler")
	}
}

func TestInterceptorUnary(t *testing.T) {
	s := newServer(t, nil, authz.WithPeerID(headerPeerID))
	ctx := context.Background()

	// Denied: PermissionDenied naming the reasons and the decision.
	secret := "DHHC-1:00:not-a-real-secret-but-do-not-log-it:"
	req, _ := structpb.NewStruct(map[string]any{"secret": secret})
	st := wantCode(t, s.addTarget(as(ctx, nodeID), req), codes.PermissionDenied, "")
	m := deniedRE.FindStringSubmatch(st.Message())
	if m == nil {
		t.Fatalf("message %q", st.Message())
	}
	if s.inv.calls != 0 {
		t.Fatal("the handler ran for a denied call")
	}
	logs := s.log.String()
	if !strings.Contains(logs, "level=INFO") || !strings.Contains(logs, "decision_id="+m[1]) ||
		!strings.Contains(logs, "allow=false") || !strings.Contains(logs, "caller="+nodeID) {
		t.Errorf("denial log:\n%s", logs)
	}
	if strings.Contains(logs, "not-a-real-secret") {
		t.Error("the request body reached the log")
	}

	// Allowed: the handler sees the Caller and the Decision.
	if err := s.addTarget(as(ctx, adminID), req); err != nil {
		t.Fatal(err)
	}
	if s.inv.calls != 1 {
		t.Fatal("handler not called")
	}
	want := authz.Caller{ID: adminID, TrustDomain: "example.org", Role: "admin", Name: "alice"}
	if s.inv.caller != want {
		t.Errorf("caller in handler %+v", s.inv.caller)
	}
	d := s.inv.decision
	if d == nil || !d.Allow || !uuid7RE.MatchString(d.ID) || d.Reasons[0] != "role admin may perform inventory.add_target" {
		t.Errorf("decision in handler %+v", d)
	}
	if !strings.Contains(s.log.String(), "level=DEBUG") || !strings.Contains(s.log.String(), "decision_id="+d.ID) {
		t.Errorf("allow not logged at debug:\n%s", s.log.String())
	}
	in := s.lastInput()
	if in.Action != "inventory.add_target" || in.RPC.FullMethod != "/nvmegate.v1.Inventory/AddTarget" || in.Resource != nil {
		t.Errorf("input %+v", in)
	}

	// The real health service, for any caller of the trust domain.
	hc := healthpb.NewHealthClient(s.conn)
	if _, err := hc.Check(as(ctx, nodeID), &healthpb.HealthCheckRequest{}); err != nil {
		t.Error(err)
	}
	_, err := hc.Check(as(ctx, "spiffe://other.example/node/gpu-01"), &healthpb.HealthCheckRequest{})
	wantCode(t, err, codes.PermissionDenied, "caller trust domain other.example is not the gateway's trust domain example.org; decision ")
}

func TestInterceptorStream(t *testing.T) {
	s := newServer(t, nil, authz.WithPeerID(headerPeerID))
	ctx := context.Background()
	var gotReq []any
	s.describe = func(_ context.Context, fullMethod string, req any) (string, map[string]any, error) {
		if fullMethod == "/grpc.health.v1.Health/Watch" {
			return "", nil, nil // the default action, health.watch
		}
		gotReq = append(gotReq, req)
		return "inventory.watch", map[string]any{"stream": true}, nil
	}
	m, err := s.watch(as(ctx, adminID))
	if err != nil {
		t.Fatal(err)
	}
	if m.Fields["role"].GetStringValue() != "admin" || s.inv.decision == nil || !s.inv.decision.Allow {
		t.Errorf("stream handler saw %v, decision %+v", m, s.inv.decision)
	}
	if len(gotReq) != 1 || gotReq[0] != nil {
		t.Errorf("describe got %v for a stream, want nil", gotReq)
	}
	if in := s.lastInput(); in.Action != "inventory.watch" || in.Resource["stream"] != true {
		t.Errorf("input %+v", in)
	}

	_, err = s.watch(as(ctx, nodeID))
	wantCode(t, err, codes.PermissionDenied, "permission denied: no rule allows role node to perform inventory.watch; decision ")
	if s.inv.calls != 1 {
		t.Error("the stream handler ran for a denied call")
	}

	// The real health Watch stream.
	w, err := healthpb.NewHealthClient(s.conn).Watch(as(ctx, nodeID), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health watch: %v, %v", r, err)
	}
}

func TestInterceptorDescribe(t *testing.T) {
	s := newServer(t, nil, authz.WithPeerID(headerPeerID))
	ctx := as(context.Background(), adminID)
	req, _ := structpb.NewStruct(map[string]any{"target_id": "t1"})

	// The request reaches describe, and its answer reaches the policy.
	s.describe = func(_ context.Context, fullMethod string, r any) (string, map[string]any, error) {
		id := r.(*structpb.Struct).Fields["target_id"].GetStringValue()
		return "inventory.add_target", map[string]any{"target": map[string]any{"id": id, "region": "eu-west"}}, nil
	}
	if err := s.addTarget(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := s.lastInput().Resource["target"]; !jsonEqual(got, map[string]any{"id": "t1", "region": "eu-west"}) {
		t.Errorf("resource %v", got)
	}

	s.mu.Lock()
	n := len(s.inputs)
	s.mu.Unlock()
	for _, tc := range []struct {
		err  error
		code codes.Code
		msg  string
	}{
		{status.Error(codes.NotFound, "target t1 not found"), codes.NotFound, "target t1 not found"},
		{status.Error(codes.Unavailable, "store down"), codes.Unavailable, "store down"},
		{nvmegate.Invalid("target.id", "is required"), codes.InvalidArgument, "target.id: is required"},
		{errors.New("internal: /var/lib/nvmegate/store.db: corrupt"), codes.InvalidArgument, "invalid request"},
	} {
		s.describe = func(context.Context, string, any) (string, map[string]any, error) { return "", nil, tc.err }
		st := wantCode(t, s.addTarget(ctx, req), tc.code, tc.msg)
		if strings.Contains(st.Message(), "/var/lib") {
			t.Errorf("internal detail leaked: %q", st.Message())
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.inputs) != n || s.inv.calls != 1 {
		t.Error("a call whose describe failed went on")
	}
}

func TestInterceptorAuthorizerFailure(t *testing.T) {
	// A real engine whose policy fails to evaluate on action "boom".
	b := bundle(t, map[string]string{"p.rego": `package nvmegate.authz
default allow := false
allow if to_number(input.action) > 0
decision := {"allow": allow, "reasons": ["r"], "obligations": {}}
`}, allowSample(`{"action": "1"}`), denySample(`{"action": "0"}`))
	e, _, _ := newEngine(t, b)
	s := newServer(t, e, authz.WithPeerID(headerPeerID))
	s.describe = func(context.Context, string, any) (string, map[string]any, error) { return "boom", nil, nil }
	st := wantCode(t, s.addTarget(as(context.Background(), adminID), nil), codes.Internal, "authorization failed; decision ")
	if strings.Contains(st.Message(), "to_number") {
		t.Errorf("evaluation detail leaked: %q", st.Message())
	}
	if !strings.Contains(s.log.String(), "level=ERROR") {
		t.Errorf("failure not logged at error:\n%s", s.log)
	}
	s.describe = func(context.Context, string, any) (string, map[string]any, error) { return "1", nil, nil }
	if err := s.addTarget(as(context.Background(), adminID), nil); err != nil {
		t.Fatal(err)
	}

	// Authorization ended with the call's context: the context's code, not
	// Internal (the engine returns the context's error, wrapped).
	s = newServer(t, authz.AuthorizerFunc(func(c context.Context, in *authz.Input) (*nvmegate.Decision, error) {
		ctx, cancel := context.WithDeadline(c, epoch) // long past
		defer cancel()
		return e.Authorize(ctx, in)
	}), authz.WithPeerID(headerPeerID))
	wantCode(t, s.addTarget(as(context.Background(), adminID), nil), codes.DeadlineExceeded, "")
	if !strings.Contains(s.log.String(), "deadline exceeded") {
		t.Errorf("not logged:\n%s", s.log)
	}

	// A held engine (its replica cannot load the policy in force):
	// Unavailable, and the handler does not run.
	held, _, _ := newEngine(t, nil)
	held.Hold(errors.New("policy in force not loadable"))
	s = newServer(t, held, authz.WithPeerID(headerPeerID))
	wantCode(t, s.addTarget(as(context.Background(), adminID), nil), codes.Unavailable, "cannot load the policy in force")
	if s.inv.calls != 0 {
		t.Error("handler ran under a held engine")
	}

	// An Authorizer that breaks its contract (nil, nil) fails closed.
	s = newServer(t, authz.AuthorizerFunc(func(context.Context, *authz.Input) (*nvmegate.Decision, error) { return nil, nil }),
		authz.WithPeerID(headerPeerID))
	wantCode(t, s.addTarget(as(context.Background(), adminID), nil), codes.Internal, "authorization failed")
	if s.inv.calls != 0 {
		t.Error("handler ran")
	}
}

func TestContextHelpers(t *testing.T) {
	ctx := context.Background()
	if _, ok := authz.CallerFromContext(ctx); ok {
		t.Error("caller in an empty context")
	}
	if _, ok := authz.DecisionFromContext(ctx); ok {
		t.Error("decision in an empty context")
	}
	c := authz.Caller{ID: adminID, Role: "admin"}
	d := &nvmegate.Decision{ID: "x", Allow: true}
	ctx = authz.NewContext(ctx, c, d)
	if got, ok := authz.CallerFromContext(ctx); !ok || got != c {
		t.Error("caller")
	}
	if got, ok := authz.DecisionFromContext(ctx); !ok || got != d {
		t.Error("decision")
	}
}
