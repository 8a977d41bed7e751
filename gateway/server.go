package gateway

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/internal/grpcserver"
	"github.com/nvmegate/nvmegate/lease"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Config wires a Server. Credentials, Store, Authorizer and Audit are
// required.
type Config struct {
	// Credentials are the transport credentials: mTLS with X.509-SVIDs in
	// every real deployment (identity.ServerCredentials).
	Credentials credentials.TransportCredentials
	// Store holds the inventory.
	Store InventoryStore
	// Authorizer decides every RPC.
	Authorizer authz.Authorizer
	// Audit is the audit log: every refused call and every change is
	// recorded in it before the caller is answered (audit.go), and the
	// Audit service reads it. Required: the gateway does not run unaudited.
	Audit AuditLog
	// ExportDir stages Audit.Export files; "" means the system temp dir.
	ExportDir string
	// LineageSigner signs lineage attestations (the audit log's signer);
	// nil: Audit.Lineage answers Unimplemented.
	LineageSigner attest.Signer
	// Keys is the key manager behind the Keys service; nil leaves Keys
	// answering Unimplemented.
	Keys KeyManager
	// Targets is the target agent: the Inventory service tells it of
	// inventory changes, and the TargetAgent service has it program an
	// agent's target. Nil: neither happens.
	Targets TargetProgrammer
	// Jobs keeps job scopes (*store.DB): the Jobs service, the node calls
	// of the Access service, describing them for policy, and lineage.
	// Nil: Jobs and Access answer Unimplemented, and Audit.Lineage too.
	Jobs JobStore
	// Lease is the grant lifecycle (lease.New over the store, the key
	// manager, Targets and Audit): Connect, Renew, Release, ListGrants and
	// Revoke, the end of a finished job's grants, and SweepExpired. Nil:
	// the grant RPCs answer Unimplemented, Jobs.Finish ends no grants and
	// SweepExpired none. It requires Jobs (grants are a job's) and Targets
	// (the agent that holds the grants must hear of inventory changes).
	Lease *lease.Lifecycle
	// TargetHub connects remote target agents (the TargetAgent service,
	// which has Targets program an agent's target when it connects). Nil:
	// the service answers Unimplemented.
	TargetHub TargetHub
	// Revisions reports the store's scope revision (*store.DB): with it,
	// the typed scope of a connect or renew is sealed once per job,
	// subsystem and revision (authz.Scope.Sealed) and shared by every
	// node's call on it. Nil: each call's scope is encoded anew.
	Revisions ScopeRevisions

	// ReadBarrier, for one of several replicas, brings this replica's copy
	// of the store up to the latest committed state before a call is
	// validated and decided (store.DB.Sync): what another replica wrote
	// before the call began is seen. A call it fails is Unavailable.
	ReadBarrier func(context.Context) error
	// Heartbeat is the interval of the heartbeats target agents' streams
	// get (those that take them); default targetagent.HeartbeatInterval.
	Heartbeat time.Duration
	// Self is the gateway's own SPIFFE ID: the caller of the entries of
	// what it does on its own (a re-decision's revocations).
	Self string
	// Compliance is the policy's verdict on the fabric's state
	// (*authz.Engine): with LineageSigner and Keys, the gateway makes
	// compliance attestations (AttestCompliance, Audit.Compliance). Nil:
	// it makes none.
	Compliance CompliancePolicy
	// Policy reports the loaded policy for Policy.Status; optional.
	Policy PolicyInfo
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the gRPC metrics; nil means they are not exported.
	Registerer prometheus.Registerer
	// Now defaults to time.Now.
	Now func() time.Time
	// ShutdownTimeout bounds the graceful stop; 0 means 10 seconds.
	ShutdownTimeout time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake; 0 means
	// DefaultHandshakeTimeout. A peer that has not finished by then is
	// disconnected.
	HandshakeTimeout time.Duration
	// MaxInFlight bounds the unary calls worked on at once (default 256);
	// more wait for a slot until their deadline, and past MaxWaiting
	// waiting (default 16384) they are refused Unavailable (limit.go).
	MaxInFlight, MaxWaiting int
	// MaxPerIdentity bounds one caller's (one SPIFFE ID's) unary calls
	// under way, working or waiting for a slot: default MaxInFlight/8 (32
	// of 256), negative none. MaxPerRole bounds those of all callers of a
	// role together (authz.Role*): a role not in it keeps its default
	// (admin, auditor and scheduler MaxInFlight/4 each, unknown
	// MaxInFlight/16, node, target and gateway none), a role mapped to a
	// negative number has none. A call past either is refused
	// ResourceExhausted at once, naming the bound (limit.go). New refuses
	// a role ParseCaller does not yield.
	MaxPerIdentity int
	MaxPerRole     map[string]int
}

// Server is the gRPC gateway: every nvmegate service plus health and
// reflection, behind the interceptor chain of interceptors.go.
type Server struct {
	grpc            *grpc.Server
	health          *health.Server
	authorizer      authz.Authorizer
	store           InventoryStore
	jobs            JobStore         // nil: no job scopes
	lease           *lease.Lifecycle // nil: no grants
	stopping        chan struct{}    // closed when a shutdown starts: long streams end
	audit           AuditLog
	log             *slog.Logger
	metrics         *metrics
	now             func() time.Time
	shutdownTimeout time.Duration
	limit           *limiter
	members         memberSets                  // job membership, for describe
	revisions       ScopeRevisions              // nil: scopes are not sealed
	barrier         func(context.Context) error // nil: one gateway, no other writers
	scopes          *sealedScopes
	openings        openings   // connects and renewals in flight, for Redecide
	redecideMu      sync.Mutex // one acting re-decision at a time
	self            string
	// What a compliance attestation reads and signs with (nil: none).
	keys             KeyManager
	reencrypter      *reencrypter // nil: no data-key rotation by re-encryption
	signer           attest.Signer
	compliancePolicy CompliancePolicy
	// The last attestation's time (Unix seconds, 0: none yet) and how much
	// it found out of compliance, for the metrics.
	lastAttestation, outOfCompliance atomic.Int64
	attestMu                         sync.Mutex
	lastAttested                     *Attested // what Audit.Compliance serves for a minute
	// journaled: the store sequences its writes in the audit log, and a
	// call's entry can be recorded in its write's commit (auditChanges).
	journaled bool
}

// New builds a Server from cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Credentials == nil || cfg.Store == nil || cfg.Authorizer == nil || cfg.Audit == nil {
		return nil, errors.New("gateway: Credentials, Store, Authorizer and Audit are required")
	}
	switch {
	case cfg.Lease != nil && cfg.Jobs == nil:
		return nil, errors.New("gateway: Lease needs Jobs: grants are issued in a job's scope")
	case cfg.Lease != nil && cfg.Targets == nil:
		return nil, errors.New("gateway: Lease needs Targets: the agent that programs the grants must hear of inventory changes")
	}
	j, _ := cfg.Store.(interface{ Journaled() bool })
	s := &Server{
		journaled:        j != nil && j.Journaled(),
		authorizer:       cfg.Authorizer,
		store:            cfg.Store,
		jobs:             cfg.Jobs,
		lease:            cfg.Lease,
		audit:            cfg.Audit,
		log:              cfg.Logger,
		now:              cfg.Now,
		shutdownTimeout:  cfg.ShutdownTimeout,
		revisions:        cfg.Revisions,
		barrier:          cfg.ReadBarrier,
		self:             cfg.Self,
		keys:             cfg.Keys,
		signer:           cfg.LineageSigner,
		compliancePolicy: cfg.Compliance,
		scopes:           &sealedScopes{m: map[sealedKey]*authz.Scope{}},
		health:           health.NewServer(),
		stopping:         make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.shutdownTimeout == 0 {
		s.shutdownTimeout = 10 * time.Second
	}
	var err error
	if s.metrics, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if s.limit, err = newLimiter(limits{inFlight: cfg.MaxInFlight, waiting: cfg.MaxWaiting,
		perIdentity: cfg.MaxPerIdentity, perRole: cfg.MaxPerRole}); err != nil {
		return nil, err
	}
	s.limit.refused = s.metrics.overShare
	if cfg.Registerer != nil {
		if err := s.registerComplianceMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
	}
	s.grpc = grpc.NewServer(append(grpcserver.ConnectionOptions(cmp.Or(cfg.HandshakeTimeout, DefaultHandshakeTimeout), streamWorkers),
		grpc.Creds(cfg.Credentials),
		grpc.ChainUnaryInterceptor(s.unaryInterceptors()...),
		grpc.ChainStreamInterceptor(s.streamInterceptors()...),
	)...)
	inv := &inventoryService{store: cfg.Store, targets: cfg.Targets}
	if cfg.Keys != nil {
		inv.erase = cfg.Keys
	}
	if cfg.Lease != nil {
		inv.rebind = cfg.Lease
	}
	pb.RegisterInventoryServer(s.grpc, inv)
	pb.RegisterPolicyServer(s.grpc, &policyService{info: cfg.Policy, redecide: s.Redecide})
	if cfg.Keys != nil {
		if g, ok := cfg.Jobs.(SubsystemGrants); ok && cfg.Targets != nil { // *store.DB
			s.reencrypter = &reencrypter{keys: cfg.Keys, store: cfg.Store, grants: g, targets: cfg.Targets, now: s.now}
		}
		pb.RegisterKeysServer(s.grpc, &keysService{keys: cfg.Keys, store: cfg.Store, reencrypter: s.reencrypter})
	} else {
		pb.RegisterKeysServer(s.grpc, pb.UnimplementedKeysServer{})
	}
	audits := &auditService{log: cfg.Audit, exportDir: cfg.ExportDir, jobs: s.jobs, store: cfg.Store, signer: cfg.LineageSigner,
		attest: s.recentAttestation}
	pb.RegisterAuditServer(s.grpc, audits)
	// Without a job store (or a lease, for grants) these answer
	// Unimplemented after validation and policy: never a fake success.
	if s.jobs != nil {
		js := &jobsService{store: s.jobs, lease: s.lease, log: s.log, now: s.now,
			record: func(ctx context.Context, e audit.Entry) error {
				if _, _, err := s.audit.Append(ctx, e); err != nil {
					return errAuditUnavailable
				}
				return nil
			}}
		if cfg.LineageSigner != nil {
			js.lineage = audits.lineage
		}
		pb.RegisterAccessServer(s.grpc, &accessService{store: cfg.Store, lease: s.lease, now: s.now})
		pb.RegisterJobsServer(s.grpc, js)
	} else {
		pb.RegisterAccessServer(s.grpc, pb.UnimplementedAccessServer{})
		pb.RegisterJobsServer(s.grpc, pb.UnimplementedJobsServer{})
	}
	if cfg.Targets != nil && cfg.TargetHub != nil {
		ta := &targetAgentService{store: cfg.Store, hub: cfg.TargetHub, targets: cfg.Targets, stopping: s.stopping, log: s.log,
			refused: s.metrics.agentsRefused, barrier: cfg.ReadBarrier, heartbeat: cfg.Heartbeat}
		if c, ok := cfg.Keys.(DataKeyCommitter); ok { // keys.Manager
			ta.keys = c
		}
		pb.RegisterTargetAgentServer(s.grpc, ta)
	} else {
		pb.RegisterTargetAgentServer(s.grpc, pb.UnimplementedTargetAgentServer{})
	}
	healthpb.RegisterHealthServer(s.grpc, stoppingHealth{s.health, s.stopping})
	reflection.Register(s.grpc)
	return s, nil
}

// DefaultHandshakeTimeout bounds a connection's TLS handshake when
// Config.HandshakeTimeout is zero: not below what a job start needs —
// 10,000 nodes connecting at once share the CPU for their handshakes
// (about 10 s of handshakes on two cores), and a bound any nearer would
// cut off the last of them, which then start again from scratch.
const DefaultHandshakeTimeout = 30 * time.Second

// streamWorkers is the size of the reused handler goroutine pool: enough
// for the calls that wait on a commit or a target at once.
const streamWorkers = 128

// Serve answers on lis until ctx is done, then stops gracefully: in-flight
// calls get ShutdownTimeout to finish before connections are closed. It is a
// Run-style task: it returns nil after a shutdown it was asked for.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	s.health.Resume()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.health.Shutdown()
	close(s.stopping) // target agents' streams end; their agents reconnect to the next gateway
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.shutdownTimeout):
		s.log.Warn("graceful stop timed out; closing connections", "timeout", s.shutdownTimeout)
		s.grpc.Stop()
		<-done
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
