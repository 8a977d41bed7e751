package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

const (
	admin   = "/admin/ops"
	node    = "/node/acme-gpu-1"
	sched   = "/tenant/acme/scheduler/slurm"
	auditor = "/auditor/audit"

	subNQN  = "nqn.2026-01.io.nvmegate.test:acme-train"
	hostNQN = "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	digest  = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func wantCode(t *testing.T, err error, want codes.Code, contains ...string) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != want {
		t.Fatalf("got %v %q, want %v", st.Code(), st.Message(), want)
	}
	for _, s := range contains {
		if !strings.Contains(st.Message(), s) {
			t.Fatalf("message %q does not contain %q", st.Message(), s)
		}
	}
}

// The handshake refuses callers outside the trust domain, with expired SVIDs
// or without a client certificate; no RPC of theirs reaches policy.
func TestHandshakeRefusals(t *testing.T) {
	g := startGateway(t)
	now := time.Now()

	foreignCA, err := devca.New(spiffeid.RequireTrustDomainFromString("evil.test"), now)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := foreignCA.Issue(spiffeid.RequireFromString("spiffe://evil.test/admin/ops"), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	expired, err := g.ca.Issue(spiffeid.RequireFromPath(td, admin), now.Add(-2*time.Hour), now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The foreign client trusts the gateway's CA so that only the gateway's
	// check can refuse it.
	foreignSrc := identity.StaticSource(foreign, g.ca.Bundle())

	roots := x509.NewCertPool()
	roots.AddCert(g.ca.Certificate())
	noCert, err := grpc.NewClient(g.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: roots, ServerName: "ignored", InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()

	for name, conn := range map[string]*grpc.ClientConn{
		"foreign trust domain": dialRaw(t, g.addr, foreignSrc),
		"expired SVID":         dial(t, g.addr, identity.StaticSource(expired, g.ca.Bundle())),
		"no client cert":       noCert,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := pb.NewInventoryClient(conn).ListTargets(ctxT(t), &pb.ListTargetsRequest{})
			wantCode(t, err, codes.Unavailable)
		})
	}
	// Nothing was decided for them: the request counter saw no calls.
	if n := requestCount(t, g, ""); n != 0 {
		t.Fatalf("%v RPCs reached the gateway from refused peers", n)
	}
	// The control: a current SVID of the trust domain gets through the same
	// gateway (its answer is the policy's, not the handshake's).
	_, err = pb.NewInventoryClient(g.client(t, node)).ListTargets(ctxT(t), &pb.ListTargetsRequest{})
	wantCode(t, err, codes.PermissionDenied)
	if n := requestCount(t, g, ""); n != 1 {
		t.Fatalf("request count after the control call = %v, want 1", n)
	}
}

// dialRaw trusts any server: used for a foreign client that must get as far
// as the gateway's own check.
func dialRaw(t *testing.T, addr string, src identity.Source) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(identity.ClientCredentials(src, func(spiffeid.ID, [][]*x509.Certificate) error { return nil })))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestPermissionDenied(t *testing.T) {
	g := startGateway(t)
	for _, who := range []string{node, sched, auditor, "/somebody/else"} {
		_, err := pb.NewInventoryClient(g.client(t, who)).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: validTarget()})
		wantCode(t, err, codes.PermissionDenied, "decision")
	}
	// The admin is allowed the same request.
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddTarget(ctxT(t), &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
}

func validTarget() *pb.Target {
	return &pb.Target{Id: "stor-eu-1", Fabric: "fab-eu", Region: "eu-west", Driver: "nvmet", Ports: []*pb.Port{
		{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.10", ServiceId: "4420"},
		{Id: 2, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.10", ServiceId: "4421", SecureChannel: "required"},
	}}
}

func validSubsystem() *pb.Subsystem {
	return &pb.Subsystem{Nqn: subNQN, TargetId: "stor-eu-1", Tenant: "acme", PortIds: []uint32{1, 2}, Dhchap: true, Tls: true}
}

func validNamespace() *pb.Namespace {
	return &pb.Namespace{SubsystemNqn: subNQN, Nsid: 1, Tenant: "acme", Region: "eu-west", DataClass: "internal",
		Dataset: &pb.Dataset{Name: "common-crawl/2026-10", Digest: digest}, Qos: &pb.QoS{MaxIops: 1000}}
}

func TestInventoryLifecycle(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)

	tr, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Target.CreatedAt == nil || len(tr.Target.Ports) != 2 {
		t.Fatalf("stored target: %v", tr.Target)
	}
	_, err = inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()})
	wantCode(t, err, codes.AlreadyExists, "stor-eu-1")

	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()}); err != nil {
		t.Fatal(err)
	}
	// The one-tenant-per-subsystem invariant answers InvalidArgument naming the field.
	other := validNamespace()
	other.Nsid, other.Tenant = 2, "globex"
	_, err = inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: other})
	wantCode(t, err, codes.InvalidArgument, "namespace.tenant", "acme", "globex")

	// A subsystem on a port the target lacks.
	bad := validSubsystem()
	bad.Nqn, bad.PortIds = subNQN+"-2", []uint32{9}
	_, err = inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: bad})
	wantCode(t, err, codes.InvalidArgument, "subsystem.port_ids[0]")

	if _, err := inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: "spiffe://nvmegate.test" + node, HostNqn: hostNQN, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	_, err = inv.AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: "spiffe://nvmegate.test/node/thief", HostNqn: hostNQN}})
	wantCode(t, err, codes.FailedPrecondition)

	ns, err := inv.GetNamespace(ctx, &pb.GetNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(ns.Namespace.Dataset, validNamespace().Dataset) || ns.Namespace.Qos.MaxIops != 1000 {
		t.Fatalf("namespace round trip: %v", ns.Namespace)
	}
	list, err := inv.ListSubsystems(ctx, &pb.ListSubsystemsRequest{Tenant: "acme"})
	if err != nil || len(list.Subsystems) != 1 || list.Subsystems[0].Nqn != subNQN {
		t.Fatalf("ListSubsystems = %v, %v", list, err)
	}
	if list, err := inv.ListSubsystems(ctx, &pb.ListSubsystemsRequest{Tenant: "globex"}); err != nil || len(list.Subsystems) != 0 {
		t.Fatalf("ListSubsystems(globex) = %v, %v", list, err)
	}

	// Removal order is enforced.
	_, err = inv.RemoveSubsystem(ctx, &pb.RemoveSubsystemRequest{Nqn: subNQN})
	wantCode(t, err, codes.FailedPrecondition)
	_, err = inv.RemoveTarget(ctx, &pb.RemoveTargetRequest{Id: "stor-eu-1"})
	wantCode(t, err, codes.FailedPrecondition)
	for _, call := range []func() error{
		func() error {
			_, err := inv.RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1})
			return err
		},
		func() error { _, err := inv.RemoveSubsystem(ctx, &pb.RemoveSubsystemRequest{Nqn: subNQN}); return err },
		func() error { _, err := inv.RemoveTarget(ctx, &pb.RemoveTargetRequest{Id: "stor-eu-1"}); return err },
		func() error {
			_, err := inv.RemoveHostBinding(ctx, &pb.RemoveHostBindingRequest{SpiffeId: "spiffe://nvmegate.test" + node})
			return err
		},
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	_, err = inv.GetTarget(ctx, &pb.GetTargetRequest{Id: "stor-eu-1"})
	wantCode(t, err, codes.NotFound, "stor-eu-1")
}

func TestListPagination(t *testing.T) {
	g := startGateway(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	for i := range 5 {
		tg := validTarget()
		tg.Id = "stor-" + string(rune('a'+i))
		if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: tg}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	token := ""
	for range 10 {
		resp, err := inv.ListTargets(ctx, &pb.ListTargetsRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range resp.Targets {
			ids = append(ids, tg.Id)
		}
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if got := strings.Join(ids, ","); got != "stor-a,stor-b,stor-c,stor-d,stor-e" {
		t.Fatalf("paged listing = %s", got)
	}
	_, err := inv.ListTargets(ctx, &pb.ListTargetsRequest{PageToken: "garbage!"})
	wantCode(t, err, codes.InvalidArgument, "page_token")
}

// malformed holds one malformed request for every RPC that has input, and the
// field its error must name.
var malformed = map[string]struct {
	req   proto.Message
	field string
}{
	"/nvmegate.v1.Inventory/AddTarget":         {&pb.AddTargetRequest{Target: func() *pb.Target { t := validTarget(); t.Ports[1].Address = "10.0.0.300"; return t }()}, "target.ports[1].address"},
	"/nvmegate.v1.Inventory/GetTarget":         {&pb.GetTargetRequest{Id: "Bad ID"}, "id"},
	"/nvmegate.v1.Inventory/ListTargets":       {&pb.ListTargetsRequest{PageSize: -1}, "page_size"},
	"/nvmegate.v1.Inventory/RemoveTarget":      {&pb.RemoveTargetRequest{}, "id"},
	"/nvmegate.v1.Inventory/AddSubsystem":      {&pb.AddSubsystemRequest{Subsystem: func() *pb.Subsystem { s := validSubsystem(); s.Nqn = "nqn.x"; return s }()}, "subsystem.nqn"},
	"/nvmegate.v1.Inventory/GetSubsystem":      {&pb.GetSubsystemRequest{Nqn: "iqn.2026-01.com.example:x"}, "nqn"},
	"/nvmegate.v1.Inventory/ListSubsystems":    {&pb.ListSubsystemsRequest{Tenant: "ACME"}, "tenant"},
	"/nvmegate.v1.Inventory/RemoveSubsystem":   {&pb.RemoveSubsystemRequest{Nqn: nvmegate.DiscoveryNQN}, "nqn"},
	"/nvmegate.v1.Inventory/AddNamespace":      {&pb.AddNamespaceRequest{Namespace: func() *pb.Namespace { n := validNamespace(); n.Dataset.Digest = "md5:00"; return n }()}, "namespace.dataset.digest"},
	"/nvmegate.v1.Inventory/GetNamespace":      {&pb.GetNamespaceRequest{SubsystemNqn: subNQN, Nsid: 0}, "nsid"},
	"/nvmegate.v1.Inventory/ListNamespaces":    {&pb.ListNamespacesRequest{Region: "eu west"}, "region"},
	"/nvmegate.v1.Inventory/RemoveNamespace":   {&pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 0xFFFFFFFF}, "nsid"},
	"/nvmegate.v1.Inventory/AddHostBinding":    {&pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: "https://example.org/node/x", HostNqn: hostNQN}}, "binding.spiffe_id"},
	"/nvmegate.v1.Inventory/GetHostBinding":    {&pb.GetHostBindingRequest{SpiffeId: "spiffe://nvmegate.test"}, "spiffe_id"},
	"/nvmegate.v1.Inventory/ListHostBindings":  {&pb.ListHostBindingsRequest{PageSize: 5000}, "page_size"},
	"/nvmegate.v1.Inventory/RemoveHostBinding": {&pb.RemoveHostBindingRequest{}, "spiffe_id"},
	"/nvmegate.v1.Jobs/Admit": {&pb.AdmitRequest{JobId: "job-1", Tenant: "acme", Nodes: []string{"spiffe://nvmegate.test/node/a"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: subNQN, Nsid: 1}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(time.Hour))}, "namespaces[0].mode"},
	"/nvmegate.v1.Jobs/Get":               {&pb.JobsGetRequest{JobId: "job with spaces"}, "job_id"},
	"/nvmegate.v1.Jobs/List":              {&pb.JobsListRequest{State: 42}, "state"},
	"/nvmegate.v1.Jobs/Finish":            {&pb.FinishRequest{JobId: "job-1", Reason: strings.Repeat("x", 300)}, "reason"},
	"/nvmegate.v1.Jobs/UpdateNodes":       {&pb.UpdateNodesRequest{JobId: "job-1", RemoveNodes: []string{"spiffe://nvmegate.test/tenant/acme"}}, "remove_nodes[0]"},
	"/nvmegate.v1.Access/Discover":        {&pb.DiscoverRequest{}, "job_id"},
	"/nvmegate.v1.Access/Connect":         {&pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN, Ttl: durationpb.New(-time.Second)}, "ttl"},
	"/nvmegate.v1.Access/Renew":           {&pb.RenewRequest{GrantId: "short"}, "grant_id"},
	"/nvmegate.v1.Access/Release":         {&pb.ReleaseRequest{GrantId: "has/slash-in-it"}, "grant_id"},
	"/nvmegate.v1.Access/ListGrants":      {&pb.ListGrantsRequest{Node: "node-1"}, "node"},
	"/nvmegate.v1.Access/Revoke":          {&pb.RevokeRequest{Reason: "compromised"}, "selector"},
	"/nvmegate.v1.Keys/Rotate":            {&pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN, Nsid: 3}, "nsid"},
	"/nvmegate.v1.Keys/Status":            {&pb.KeysStatusRequest{Kind: 9}, "kind"},
	"/nvmegate.v1.Policy/Explain":         {&pb.ExplainRequest{InputJson: []byte(`[1,2]`)}, "input_json"},
	"/nvmegate.v1.Policy/Impact":          {&pb.ImpactRequest{CandidateFiles: map[string][]byte{"../authz.rego": nil}}, "candidate_files"},
	"/nvmegate.v1.Audit/Query":            {&pb.QueryRequest{Nsid: 1}, "nsid"},
	"/nvmegate.v1.Audit/InclusionProof":   {&pb.InclusionProofRequest{Index: 5, TreeSize: 5}, "index"},
	"/nvmegate.v1.Audit/ConsistencyProof": {&pb.ConsistencyProofRequest{FromSize: 0}, "from_size"},
	"/nvmegate.v1.Audit/Lineage":          {&pb.LineageRequest{JobId: ""}, "job_id"},
}

// Every RPC with malformed input answers InvalidArgument naming the field, for
// the admin (allowed) and for a node (whose request is also refused by policy,
// but validation comes first); nothing panics. The table must cover every
// method of the API whose request has fields.
func TestMalformedInputEveryRPC(t *testing.T) {
	g := startGateway(t)
	conns := map[string]*grpc.ClientConn{"admin": g.client(t, admin), "node": g.client(t, node)}

	for _, m := range apiMethods(t) {
		full := "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
		tc, ok := malformed[full]
		if m.IsStreamingServer() || m.Input().Fields().Len() == 0 {
			continue // Export and the argument-less RPCs cannot be malformed
		}
		if !ok {
			t.Errorf("%s: no malformed-input case", full)
			continue
		}
		for who, conn := range conns {
			t.Run(full+"/"+who, func(t *testing.T) {
				resp := dynamicResponse(t, m)
				err := conn.Invoke(ctxT(t), full, tc.req, resp)
				wantCode(t, err, codes.InvalidArgument, tc.field)
			})
		}
	}
}

func apiMethods(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	var out []protoreflect.MethodDescriptor
	for _, svc := range []string{"Inventory", "Jobs", "Access", "Keys", "Policy", "Audit"} {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName("nvmegate.v1." + svc))
		if err != nil {
			t.Fatal(err)
		}
		methods := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range methods.Len() {
			out = append(out, methods.Get(i))
		}
	}
	return out
}

func dynamicResponse(t *testing.T, m protoreflect.MethodDescriptor) proto.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(m.Output().FullName())
	if err != nil {
		t.Fatal(err)
	}
	return mt.New().Interface()
}

// What is not built answers Unimplemented once validation and policy pass:
// never a fake success. Audit.Lineage waits for lineage attestations; a
// gateway without a target agent issues no credentials. An allow-all
// authorizer isolates the handlers from policy here.
func TestUnimplemented(t *testing.T) {
	allowAll := authz.AuthorizerFunc(func(_ context.Context, in *authz.Input) (*nvmegate.Decision, error) {
		return &nvmegate.Decision{ID: "test", Allow: true, Reasons: []string{"test allows all"}}, nil
	})
	g := startGateway(t, func(c *gateway.Config) { c.Authorizer = allowAll; c.Targets = nil; c.LineageSigner = nil })
	acmeInventory(t, g)
	ctx := ctxT(t)
	_, err := pb.NewAuditClient(g.client(t, auditor)).Lineage(ctx, &pb.LineageRequest{JobId: "job-1"})
	wantCode(t, err, codes.Unimplemented, "signs no lineage")
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	wantCode(t, err, codes.Unimplemented, "issues no credentials")
	_, err = pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{})
	wantCode(t, err, codes.Unimplemented)
}

func TestPolicyStatusHealthAndMetrics(t *testing.T) {
	g := startGateway(t)
	st, err := pb.NewPolicyClient(g.client(t, admin)).Status(ctxT(t), &pb.PolicyStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Revision != g.engine.Status().Revision || !strings.HasPrefix(st.Revision, "sha256:") || st.Source != "embedded" || len(st.Modules) == 0 {
		t.Fatalf("policy status = %v", st)
	}
	// Any member of the trust domain may check health.
	h, err := healthpb.NewHealthClient(g.client(t, node)).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health = %v, %v", h, err)
	}
	// A denied call is counted under its code.
	_, err = pb.NewInventoryClient(g.client(t, node)).ListTargets(ctxT(t), &pb.ListTargetsRequest{})
	wantCode(t, err, codes.PermissionDenied)
	if n := requestCount(t, g, "PermissionDenied"); n != 1 {
		t.Fatalf("PermissionDenied count = %v, want 1", n)
	}
}

// requestCount sums nvmegate_grpc_requests_total for code ("" for all codes).
func requestCount(t *testing.T, g *testGateway, code string) float64 {
	return counterSum(t, g, "nvmegate_grpc_requests_total", "code", code)
}

// counterSum sums counter name of g's registry over the series whose label
// has value ("" for any value).
func counterSum(t *testing.T, g *testGateway, name, label, value string) float64 {
	t.Helper()
	mfs, err := g.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == label && (value == "" || l.GetValue() == value) {
					n += m.Counter.GetValue()
				}
			}
		}
	}
	return n
}

// Explain dry-runs an input document against the live policy, or a
// candidate, and returns the decision with its reasons; only admins may.
func TestPolicyExplain(t *testing.T) {
	g := startGateway(t)
	pol := pb.NewPolicyClient(g.client(t, admin))
	input := []byte(`{
	  "caller": {"id": "spiffe://nvmegate.test/node/acme-gpu-1", "trust_domain": "nvmegate.test", "role": "node", "tenant": "", "name": "acme-gpu-1"},
	  "rpc": {"service": "nvmegate.v1.Inventory", "method": "AddTarget", "full_method": "/nvmegate.v1.Inventory/AddTarget"},
	  "action": "inventory.add_target", "resource": {"kind": "target", "tenant": ""},
	  "time": "2026-12-02T10:00:00Z", "gateway": {"trust_domain": "nvmegate.test"}}`)
	resp, err := pol.Explain(ctxT(t), &pb.ExplainRequest{InputJson: input})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Decision.Allow || len(resp.Decision.Reasons) == 0 || resp.Decision.PolicyRevision != g.engine.Status().Revision || len(resp.DecisionJson) == 0 {
		t.Fatalf("explain = %v %s", resp.Decision, resp.DecisionJson)
	}
	// A candidate that adds a module: compiled and self-tested, evaluated
	// under its own revision, never swapped in.
	extra := map[string]string{"extra.rego": "package nvmegate.extra\n\nnote := \"reviewed\"\n"}
	cand, err := pol.Explain(ctxT(t), &pb.ExplainRequest{InputJson: input, CandidateModules: extra})
	if err != nil {
		t.Fatal(err)
	}
	if cand.Decision.Allow || cand.Decision.PolicyRevision == g.engine.Status().Revision {
		t.Fatalf("candidate explain = %v", cand.Decision)
	}
	// A candidate that does not compile is refused, saying why.
	_, err = pol.Explain(ctxT(t), &pb.ExplainRequest{InputJson: input, CandidateModules: map[string]string{"broken.rego": "package x\n\nallow := {"}})
	wantCode(t, err, codes.InvalidArgument, "candidate_modules", "does not compile")
	// Nothing changed on the gateway.
	if st, _ := pol.Status(ctxT(t), &pb.PolicyStatusRequest{}); st.Revision != g.engine.Status().Revision {
		t.Fatal("explain changed the serving policy")
	}
	_, err = pb.NewPolicyClient(g.client(t, node)).Explain(ctxT(t), &pb.ExplainRequest{InputJson: input})
	wantCode(t, err, codes.PermissionDenied)
}

// A replica decides only on the latest state: every call passes the read
// barrier first, and a call whose barrier fails (etcd out of reach) is
// refused Unavailable, not decided on what the replica's copy holds.
func TestReadBarrier(t *testing.T) {
	var calls atomic.Int64
	var down atomic.Bool
	g := startGateway(t, func(c *gateway.Config) {
		c.ReadBarrier = func(context.Context) error {
			calls.Add(1)
			if down.Load() {
				return errors.New("etcd unreachable")
			}
			return nil
		}
	})
	inv := pb.NewInventoryClient(g.client(t, admin))
	if _, err := inv.AddTarget(ctxT(t), &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	if calls.Load() == 0 {
		t.Fatal("a call did not pass the read barrier")
	}
	down.Store(true)
	_, err := inv.ListTargets(ctxT(t), &pb.ListTargetsRequest{})
	wantCode(t, err, codes.Unavailable, "latest state")
}
