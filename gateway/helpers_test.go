package gateway_test

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/policy"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

var td = spiffeid.RequireTrustDomainFromString("nvmegate.test")

// testGateway is a real gateway on 127.0.0.1:0: real mTLS with SVIDs from an
// in-process CA, the shipped Rego, bbolt in a temp dir.
type testGateway struct {
	addr     string
	ca       *devca.CA
	registry *prometheus.Registry
	engine   *authz.Engine
	audit    *audit.Log // the real log in a temp dir, signed by an Ed25519 key
	auditKey attest.PublicKey
	keyStore *localstore.Store // the real local key store in a temp dir
	configfs string            // the nvmet driver's trees, one per target ID
	// remote are the targets programmed by their own agents (startRemote):
	// the embedded driver leaves them alone.
	remote *sync.Map
	db     *store.DB
	// journal is the store's journal (the log), with a hook a test can
	// set to act just before a write is proposed: between a call's
	// decision and its commit.
	journal *hookedJournal
	agent   *targetagent.Agent
	lease   *lease.Lifecycle
	srv     *gateway.Server
	stop    func() error // shuts the gateway down (once) and returns what Serve did
}

type gatewayOption func(*gateway.Config)

func startGateway(t testing.TB, opts ...gatewayOption) *testGateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	now := time.Now()
	ca, err := devca.New(td, now)
	if err != nil {
		t.Fatal(err)
	}
	svid, err := ca.Issue(spiffeid.RequireFromPath(td, "/gateway/test"), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The store's clock is the gateway's (Config.Now, if an option sets
	// one): expiries and renewal deadlines are read against it.
	var clock func() time.Time
	bundle, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	logOut := io.Discard
	if os.Getenv("NVMEGATE_TEST_LOG") != "" {
		logOut = os.Stderr // debugging: the gateway's log on stderr
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))
	engine, err := authz.NewEngine(ctx, authz.Options{TrustDomain: td, Bundle: bundle, Source: "embedded", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := attest.NewLocalSigner(signer, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	alog, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/audit", Signer: ls})
	if err != nil {
		t.Fatal(err)
	}
	// Journaled, as one gateway's store is (cmd/nvmegated): the log
	// sequences every write.
	journal := &hookedJournal{Log: alog}
	db, err := store.Open(filepath.Join(t.TempDir(), "inventory.db"), store.Options{Journal: journal, Now: func() time.Time {
		if clock != nil {
			return clock()
		}
		return time.Now()
	}})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := localstore.Open(filepath.Join(dir, "keys.db"), filepath.Join(dir, "keys.key"))
	if err != nil {
		t.Fatal(err)
	}
	km, err := keys.NewManager(keys.Options{Backend: ks, OnRotate: gateway.AuditRotations(alog, "spiffe://nvmegate.test/gateway/test")})
	if err != nil {
		t.Fatal(err)
	}
	configfs := filepath.Join(dir, "configfs")
	hub := &targetagent.Hub{AckTimeout: 5 * time.Second}
	var (
		driversMu sync.Mutex
		drivers   = map[string]*nvmet.Driver{} // one per target, as the daemon keeps them
	)
	remote := &sync.Map{}
	agent := &targetagent.Agent{Store: db, Keys: km, Hub: hub, Driver: func(t *nvmegate.Target) targetagent.Driver {
		if _, ok := remote.Load(t.ID); ok {
			return nil
		}
		driversMu.Lock()
		defer driversMu.Unlock()
		if drivers[t.ID] == nil {
			drivers[t.ID] = &nvmet.Driver{Root: filepath.Join(configfs, t.ID)}
		}
		return drivers[t.ID]
	}}
	reg := prometheus.NewRegistry()
	cfg := gateway.Config{
		LineageSigner: ls,
		Keys:          km,
		Targets:       agent,
		TargetHub:     agent,
		Audit:         alog,
		ExportDir:     dir,
		Credentials:   identity.ServerCredentials(identity.StaticSource(svid, ca.Bundle()), td),
		Store:         db,
		Authorizer:    engine,
		Policy:        engine,
		Compliance:    engine,
		Logger:        log,
		Registerer:    reg,
		Self:          "spiffe://nvmegate.test/gateway/test",
	}
	for _, o := range opts {
		o(&cfg)
	}
	clock = cfg.Now
	// The store keeps the jobs; grants are issued where there are keys and
	// a target agent (after the options, which may take either away).
	cfg.Jobs, cfg.Revisions = db, db
	if cfg.Keys != nil && cfg.Targets != nil {
		if cfg.Lease, err = lease.New(lease.Config{Grants: db, Inventory: db, Keys: cfg.Keys, Audit: cfg.Audit, Targets: cfg.Targets,
			Now: cfg.Now, Logger: log}); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	var once sync.Once
	var serveErr error
	stop := func() error {
		once.Do(func() { cancel(); serveErr = <-done })
		return serveErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		db.Close()
		alog.Close()
		ks.Close()
	})
	return &testGateway{addr: lis.Addr().String(), ca: ca, registry: reg, engine: engine, audit: alog, auditKey: ls.PublicKey(), keyStore: ks, configfs: configfs, remote: remote, db: db, journal: journal, agent: agent, lease: cfg.Lease, srv: srv, stop: stop}
}

// client connects as spiffe://nvmegate.test/<path> with a fresh SVID.
func (g *testGateway) client(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	now := time.Now()
	svid, err := g.ca.Issue(spiffeid.RequireFromPath(td, path), now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return dial(t, g.addr, identity.StaticSource(svid, g.ca.Bundle()))
}

func dial(t testing.TB, addr string, src identity.Source) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(identity.ClientCredentials(src, tlsconfig.AuthorizeMemberOf(td))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// hookedJournal is the log as a store's journal, calling before (if set)
// ahead of each proposal.
type hookedJournal struct {
	*audit.Log
	before atomic.Pointer[func()]
}

func (h *hookedJournal) Propose(ctx context.Context, p audit.Proposal) (uint64, error) {
	if f := h.before.Load(); f != nil {
		(*f)()
	}
	return h.Log.Propose(ctx, p)
}
