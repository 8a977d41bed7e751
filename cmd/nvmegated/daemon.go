package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/fabric/spdk"
	"github.com/nvmegate/nvmegate/forward"
	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/keys/vaultstore"
	"github.com/nvmegate/nvmegate/leader"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// Main is the daemon: ParseFlags, then Open (everything that can fail fast,
// including binding the listeners), then Run until the context ends, then
// Close. Tests drive the real daemon through it on :0 with a temp dir.
type Main struct {
	Config Config
	// Dev, when set, provisions a dev trust domain in this directory first.
	Dev string
	// Stderr receives the logs; default os.Stderr.
	Stderr io.Writer

	log       *slog.Logger
	registry  *prometheus.Registry
	db        *store.DB
	keyStore  keys.Backend
	keys      *keys.Manager
	expire    atomic.Pointer[keys.Manager] // m.keys, for the store's hook, which may come first
	agent     *targetagent.Agent
	hub       *targetagent.Hub // remote target agents
	lease     *lease.Lifecycle // the grants: issued, renewed, ended, expired
	audit     *audit.Log
	auditKey  signer // the local KeyDir, or a Vault Transit key
	source    identity.Source
	engine    *authz.Engine
	reloader  *policyReloader // nil for the embedded policy
	redecider *redecider      // re-decides the active grants after a change
	server    *gateway.Server
	grpcLis   net.Listener
	httpLis   net.Listener
	httpSrv   *http.Server
	repl      *replication // nil: a single gateway
	seq       *sequencer   // with repl: the leader's peer service and the forwarding to it
	tail      tailState    // with repl: etcd's tail of the audit log
	// policyEngine, with repl, is the engine the policy in force in the
	// store is loaded into (policyLoaded); nil until it is made.
	policyEngine atomic.Pointer[authz.Engine]
	peers        *targetPeers // with repl: targets programmed by other replicas
}

// NewMain returns a Main with the defaults of a production daemon.
func NewMain() *Main { return &Main{Stderr: os.Stderr} }

// ParseFlags reads the command line: "dev --dir DIR [flags]" or "[flags]",
// with flags overriding the --config file.
func (m *Main) ParseFlags(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("nvmegated", flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	dev := len(args) > 0 && args[0] == "dev"
	if dev {
		args = args[1:]
		fs.StringVar(&m.Dev, "dir", ".nvmegate-dev", "directory for the dev CA, SVIDs and state")
	}
	configPath := fs.String("config", "", "YAML configuration file")
	var flags Config
	fs.StringVar(&flags.Listen, "listen", "", "gRPC listen address (default 127.0.0.1:7443)")
	fs.StringVar(&flags.HTTPListen, "http-listen", "", `metrics/health listen address, or "off" (default 127.0.0.1:7080)`)
	fs.StringVar(&flags.TrustDomain, "trust-domain", "", "SPIFFE trust domain")
	fs.StringVar(&flags.StateDir, "state-dir", "", "state directory")
	fs.StringVar(&flags.Identity.SPIFFESocket, "spiffe-socket", "", "SPIFFE Workload API address")
	fs.StringVar(&flags.Identity.SPIFFEID, "spiffe-id", "", "the gateway's SPIFFE ID, when the Workload API offers several SVIDs")
	fs.StringVar(&flags.Identity.Cert, "cert", "", "SVID certificate chain (PEM)")
	fs.StringVar(&flags.Identity.Key, "key", "", "SVID private key (PEM)")
	fs.StringVar(&flags.Identity.Bundle, "bundle", "", "trust bundle (PEM)")
	fs.StringVar(&flags.Log.Format, "log-format", "", "text or json")
	fs.StringVar(&flags.Log.Level, "log-level", "", "debug, info, warn or error")
	fs.StringVar(&flags.ReadyFile, "ready-file", "", "write the bound addresses here once serving")
	fs.StringVar(&flags.Policy.Dir, "policy-dir", "", "policy directory (.rego, data.json, selftest.json), hot-reloaded")
	fs.StringVar(&flags.Policy.Bundle, "policy-bundle", "", "OPA bundle file (.tar.gz), hot-reloaded")
	fs.StringVar(&flags.Policy.ReloadInterval, "policy-reload-interval", "", "how often to check the policy for changes (default 5s)")
	fs.BoolVar(&flags.Pprof, "pprof", false, "serve Go's profiler at /debug/pprof/ on the HTTP listener")
	remoteTargets := fs.String("remote-targets", "", "comma-separated IDs of targets programmed only by their own nvmegate-target agent")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *configPath != "" {
		c, err := loadConfig(*configPath)
		if err != nil {
			return err
		}
		m.Config = c
	}
	overlay(&m.Config, flags)
	if *remoteTargets != "" {
		m.Config.Targets.Remote = strings.Split(*remoteTargets, ",")
	}
	if m.Dev != "" {
		devDefaults(&m.Config, m.Dev)
	}
	m.Config.setDefaults()
	return nil
}

// overlay copies the flags that were set over the file's values.
func overlay(c *Config, f Config) {
	set := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	set(&c.Listen, f.Listen)
	set(&c.HTTPListen, f.HTTPListen)
	set(&c.TrustDomain, f.TrustDomain)
	set(&c.StateDir, f.StateDir)
	set(&c.Identity.SPIFFESocket, f.Identity.SPIFFESocket)
	set(&c.Identity.SPIFFEID, f.Identity.SPIFFEID)
	set(&c.Identity.Cert, f.Identity.Cert)
	set(&c.Identity.Key, f.Identity.Key)
	set(&c.Identity.Bundle, f.Identity.Bundle)
	set(&c.Log.Format, f.Log.Format)
	set(&c.Log.Level, f.Log.Level)
	set(&c.ReadyFile, f.ReadyFile)
	set(&c.Policy.Dir, f.Policy.Dir)
	set(&c.Policy.Bundle, f.Policy.Bundle)
	set(&c.Policy.ReloadInterval, f.Policy.ReloadInterval)
	c.Pprof = c.Pprof || f.Pprof
}

// Open validates the configuration and starts everything that can fail
// early: dev provisioning, identity, store, policy, listeners. When it
// returns nil the listeners are bound and GRPCAddr/HTTPAddr are known.
func (m *Main) Open(ctx context.Context) (err error) {
	if m.Stderr == nil {
		m.Stderr = os.Stderr
	}
	if m.Dev != "" {
		if err := provisionDev(m.Dev, time.Now()); err != nil {
			return fmt.Errorf("dev trust domain: %w", err)
		}
	}
	c := &m.Config
	c.setDefaults()
	if err := c.validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	m.log = newLogger(m.Stderr, c.Log)
	c.Runtime.apply(os.Getenv)
	td, _ := spiffeid.TrustDomainFromString(c.TrustDomain)

	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	storeOpts, auditOpts := store.Options{}, audit.Options{}
	if c.Etcd.enabled() {
		// One of several replicas: the files are this replica's copies of
		// the store and the log kept in etcd.
		if m.repl, err = openReplication(c.Etcd, m.log); err != nil {
			return err
		}
		// One writer: the term's leader sequences every write in the
		// replicated log; the others forward theirs to it, and every
		// replica's store is a projection of the log (DESIGN §12).
		if m.seq, err = openSequencer(c.Etcd, c.Listen, m.repl.name); err != nil {
			return err
		}
		m.repl.elector.Value = m.seq.value
		m.seq.client = &forward.Client{Resolve: m.repl.resolver(m.seq.value), Leading: func() bool { return m.db != nil && m.db.Leading() }}
		auditOpts.Replica, auditOpts.Forward, storeOpts.Forward = m.repl.log, m.seq.client, m.seq.client
		auditOpts.History = m.seq.client                       // the history etcd trimmed, from the leader's copy
		storeOpts.PolicyLoaded = m.policyLoaded                // one policy for every replica
		storeOpts.RootRotated = func(scope string, _ uint64) { // a rotation through another replica
			if k := m.expire.Load(); k != nil {
				k.Expire(scope)
			}
		}
		auditOpts.GroupWait, _ = c.Etcd.groupWait()        // checked by validate
		ack, _ := time.ParseDuration(c.Targets.AckTimeout) // checked by validate
		m.peers = newTargetPeers(m.repl, nil, ack)
		storeOpts.Applied = m.peers.changed
		// Another replica's revocation rotated its scopes' roots before
		// it was stored: this replica's kept roots of them go, and the
		// next grant there is issued under the new root.
		storeOpts.Revoked = func(scopes []string) {
			if k := m.expire.Load(); k != nil {
				k.Expire(scopes...)
			}
		}
	}
	if m.source, err = m.openIdentity(ctx); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	// An SVID of another trust domain would make every handshake fail while
	// the gateway looks healthy: refuse to start instead.
	svid, err := m.source.GetX509SVID()
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if !svid.ID.MemberOf(td) {
		return fmt.Errorf("identity: the gateway's SVID %s is not in trust domain %s", svid.ID, td)
	}
	if m.seq != nil {
		// A new copy of the log fills the history etcd no longer holds
		// from the leader's, over the peer service: it needs the SVID.
		m.seq.dial(m.source, svid.ID)
	}
	if m.auditKey, err = openSigner(ctx, c.Audit); err != nil {
		return fmt.Errorf("audit signing key: %w", err)
	}
	auditOpts.Origin, auditOpts.Signer = c.Audit.Origin, m.auditKey
	if m.audit, err = audit.Open(c.Audit.Path, auditOpts); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	// The log is the system of record, and the store its projection
	// (DESIGN §12): each write is sequenced in the log, its entries and
	// its change in one commit.
	storeOpts.Journal = m.audit
	if m.db, err = store.Open(filepath.Join(c.StateDir, "inventory.db"), storeOpts); err != nil {
		return fmt.Errorf("inventory store: %w", err)
	}
	if m.peers != nil {
		m.peers.db = m.db
	}
	if m.seq != nil {
		m.seq.serveWith(m.source, svid.ID, m.db, m.audit)
	}
	src := policySource{dir: c.Policy.Dir, bundle: c.Policy.Bundle}
	bundle, srcName, err := m.startingPolicy(src)
	if err != nil {
		return fmt.Errorf("policy %s: %w", srcName, err)
	}
	if m.engine, err = authz.NewEngine(ctx, authz.Options{TrustDomain: td, Bundle: bundle, Source: srcName, Logger: m.log}); err != nil {
		return fmt.Errorf("policy %s: %w", srcName, err)
	}
	if m.repl != nil {
		// From here on the replica's engine follows the policy in force
		// in the store (a load the projection applied while the engine
		// was made is caught up here).
		m.policyEngine.Store(m.engine)
		if p := m.db.Policy(); p != nil && p.Digest != m.engine.Status().Digest {
			m.policyLoaded(p)
		}
	}
	// The policy that decides from now on is on the record before any
	// decision is.
	self := svid.ID.String()
	if err := m.startingRecord(ctx, func() error { return recordPolicyLoad(ctx, m.audit, self, m.engine.Status(), nil) }); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if err := m.openKeys(ctx, self); err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	root := c.Targets.NVMetRoot
	spdkDrivers := map[string]*spdk.Driver{} // one per target: it remembers what it applied
	for id, st := range c.Targets.SPDK {
		spdkDrivers[id] = &spdk.Driver{Socket: st.Socket, KeyDir: st.KeyDir}
	}
	ackTimeout, _ := time.ParseDuration(c.Targets.AckTimeout) // checked by Validate
	m.hub = &targetagent.Hub{AckTimeout: ackTimeout}
	remote := map[string]bool{}
	for _, id := range c.Targets.Remote {
		remote[id] = true
	}
	var (
		nvmetMu      sync.Mutex
		nvmetDrivers = map[string]*nvmet.Driver{} // one per target: it remembers what it wrote
	)
	m.agent = &targetagent.Agent{Store: m.db, Keys: m.keys, Log: m.log, Hub: m.hub, Driver: func(t *nvmegate.Target) targetagent.Driver {
		if remote[t.ID] {
			return nil // its own agent only: no local stand-in while it is away
		}
		switch t.Driver {
		case nvmegate.DriverNVMet:
			nvmetMu.Lock()
			defer nvmetMu.Unlock()
			d := nvmetDrivers[t.ID]
			if d == nil {
				d = &nvmet.Driver{Root: filepath.Join(root, t.ID)}
				nvmetDrivers[t.ID] = d
			}
			return d
		case nvmegate.DriverSPDK:
			if d := spdkDrivers[t.ID]; d != nil {
				return d
			}
		}
		return nil // not programmed by this gateway
	}}
	if m.peers != nil {
		// A target whose agent streams from another replica is
		// programmed there; a call here waits for its acknowledgement.
		m.agent.Peers = m.peers
	}
	// Converge every target to the grants in the store before serving.
	if err := m.agent.Reconcile(ctx); err != nil {
		m.log.Error("targets not reconciled at start; retrying in the background", "err", err)
	}
	if src.dir != "" || src.bundle != "" || m.repl != nil {
		// Replicas: the leader's reloader makes its source's policy (the
		// embedded one too: replicas of two versions during an upgrade)
		// the one in force on every replica.
		m.reloader = &policyReloader{engine: m.engine, source: src, interval: c.Policy.reloadInterval(), log: m.log, audit: m.audit, self: self}
		if m.repl != nil {
			m.reloader.shared, m.reloader.sharedOK = m.db, m.allApply
		}
	}

	// The grants' lifecycle: recorded in the log, kept in the store, with
	// credentials from the key manager, programmed through the agent.
	if m.lease, err = lease.New(lease.Config{Grants: m.db, Inventory: m.db, Keys: m.keys, Audit: m.audit, Targets: m.agent, Logger: m.log}); err != nil {
		return err
	}

	m.registry = prometheus.NewRegistry()
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nvmegate_grants_removal_pending",
			Help: "Ended grants whose target has not yet acknowledged removing the host (the gateway retries; nvmegate grants list --removal-pending).",
		}, func() float64 { return float64(m.db.PendingRemovalCount()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nvmegate_target_namespaces_not_served",
			Help: "Namespaces of the targets this replica programs that are not served as the inventory says: the target cannot serve them (no cryptsetup, cryptsetup refusing one), or their data keys cannot be had; not exported, never in the clear, while the rest of each target is programmed (the gateway's log names them).",
		}, func() float64 { return float64(m.agent.NotServedCount()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nvmegate_audit_lost_compares_total",
			Help: "Commits of this replica's audit log that etcd refused because another writer had extended the log first. One leader sequences every write: outside a failover it stays at zero.",
		}, func() float64 { return float64(m.audit.LostCompares()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nvmegate_audit_etcd_tail_entries",
			Help: "Entries of the audit log etcd holds (its tail: the leader trims what the replicas' copies hold, etcd.log_trim_every); 0 on a gateway without etcd. Growing without bound means the trim is stuck: etcd fills, then refuses every write.",
		}, func() float64 {
			if m.repl == nil {
				return 0
			}
			return float64(m.audit.Size() - min(m.audit.Size(), m.tail.start.Load()))
		}))
	m.server, err = gateway.New(gateway.Config{
		MaxInFlight:    c.MaxInFlight,
		MaxPerIdentity: c.MaxInFlightPerIdentity,
		MaxPerRole:     c.MaxInFlightPerRole,

		Credentials:   identity.ServerCredentials(m.source, td),
		Store:         m.db,
		Jobs:          m.db,
		Revisions:     m.db,
		Lease:         m.lease,
		Audit:         m.audit,
		LineageSigner: m.auditKey,
		Keys:          m.keys,
		Targets:       m.agent,
		TargetHub:     m.agent,
		ExportDir:     c.StateDir,
		Authorizer:    m.engine,
		Policy:        m.engine,
		Logger:        m.log,
		Registerer:    m.registry,
		Self:          self,
		Compliance:    m.engine,
		ReadBarrier:   m.readBarrier(),

		ShutdownTimeout: stopTimeout,
	})
	if err != nil {
		return err
	}
	// Decisions stay true: re-decided after every change that can affect
	// them, from now on (the feed is made before anything is served).
	m.redecider = &redecider{server: m.server, feed: m.db.WatchScope(), log: m.log}
	if m.reloader != nil {
		m.reloader.loaded = m.redecider.policyLoaded
	}
	if m.grpcLis, err = net.Listen("tcp", c.Listen); err != nil {
		return fmt.Errorf("listen %s: %w", c.Listen, err)
	}
	if c.HTTPListen != "off" {
		if m.httpLis, err = net.Listen("tcp", c.HTTPListen); err != nil {
			return fmt.Errorf("listen %s: %w", c.HTTPListen, err)
		}
		m.httpSrv = &http.Server{Handler: m.httpHandler(), ReadHeaderTimeout: 5 * time.Second}
	}
	// The listeners are bound: connections made from now on wait in the
	// backlog until Run serves them, so the gateway counts as ready.
	if c.ReadyFile != "" {
		if err := m.writeReadyFile(); err != nil {
			return err
		}
	}
	m.log.Info("nvmegated open", "grpc", m.GRPCAddr(), "http", m.HTTPAddr(),
		"trust_domain", c.TrustDomain, "policy_revision", m.engine.Status().Revision,
		"audit_origin", m.audit.Origin(), "audit_size", m.audit.Size(), "audit_key", m.auditKey.PublicKey().KeyID())
	return nil
}

func (m *Main) openIdentity(ctx context.Context) (identity.Source, error) {
	id := m.Config.Identity
	if id.SPIFFESocket != "" {
		// Bound the wait for the first SVID: an agent that never answers
		// must fail the start, not hang it.
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return identity.NewWorkloadSource(ctx, id.SPIFFESocket, id.SPIFFEID)
	}
	return identity.NewFileSource(id.Cert, id.Key, id.Bundle, identity.WithLogger(m.log))
}

// openKeys opens the key store and the manager, whose rotations go to the
// audit log, and warms its cache with every inventory subsystem so that no
// connect waits on the store.
func (m *Main) openKeys(ctx context.Context, self string) error {
	c := m.Config.Keys
	var err error
	switch c.Backend {
	case "vault":
		v := c.Vault
		vc := vaultstore.Config{Address: v.Address, CACert: v.CACert, TokenFile: v.TokenFile,
			KVMount: v.KVMount, TransitMount: v.TransitMount, Prefix: v.Prefix, Logger: m.log}
		switch {
		case v.AppRole != nil:
			vc.AppRole = &vaultstore.AppRole{RoleID: v.AppRole.RoleID, SecretIDFile: v.AppRole.SecretIDFile, Mount: v.AppRole.Mount}
		case v.Cert != nil:
			id := m.Config.Identity
			if id.Cert == "" {
				return errors.New("vault cert auth uses the gateway's SVID files: set identity.cert and identity.key")
			}
			vc.Cert = &vaultstore.CertAuth{Mount: v.Cert.Mount, Name: v.Cert.Name}
			vc.ClientCert, vc.ClientKey = id.Cert, id.Key
		case v.TokenFile == "":
			vc.Token = os.Getenv("VAULT_TOKEN")
		}
		m.keyStore, err = vaultstore.Open(ctx, vc)
	default:
		m.keyStore, err = localstore.Open(c.LocalPath, c.LocalKeyFile)
	}
	if err != nil {
		return err
	}
	rotation, dataKeys, grace, refresh, stale := c.durations()
	m.keys, err = keys.NewManager(keys.Options{Backend: m.keyStore, RotationPeriod: rotation, DataKeyRotationPeriod: dataKeys, Grace: grace,
		RefreshInterval: refresh, MaxStaleness: stale, Logger: m.log,
		OnRotate: gateway.AuditRotations(m.audit, self), OnRotated: m.noteRotated})
	if err != nil {
		return err
	}
	m.expire.Store(m.keys)
	subs, err := store.All(func(p store.Page) ([]*nvmegate.Subsystem, string, error) {
		return m.db.ListSubsystems(ctx, store.SubsystemFilter{}, p)
	})
	if err != nil {
		return err
	}
	targets, err := store.All(func(p store.Page) ([]*nvmegate.Target, string, error) {
		return m.db.ListTargets(ctx, store.TargetFilter{}, p)
	})
	if err != nil {
		return err
	}
	byID := map[string]*nvmegate.Target{}
	for _, t := range targets {
		byID[t.ID] = t
	}
	names := make([]string, 0, len(subs))
	for _, s := range subs {
		if t := byID[s.TargetID]; t != nil {
			names = append(names, nvmegate.CredentialScope(t, s))
		}
	}
	nss, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
		return m.db.ListNamespaces(ctx, store.NamespaceFilter{}, p)
	})
	if err != nil {
		return err
	}
	for _, n := range nss {
		m.keys.TrackDataKeys(gateway.NamespaceKeyName(n.SubsystemNQN, n.NSID))
	}
	if err := m.keys.Warm(ctx, names...); err != nil {
		// Not fatal: the store may be briefly unreachable; first use and
		// the background refresh load what is missing.
		m.log.Warn("keys: cache not warmed", "err", err)
	}
	return nil
}

// every calls fn every d until ctx ends.
// settleInterval is how often pending removals are retried.
const settleInterval = 5 * time.Second

func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// signer is a checkpoint signer that can list its key versions.
type signer interface {
	attest.Signer
	PublicKeys() []attest.PublicKey
}

// openSigner opens the checkpoint signing key: a Vault Transit key if
// configured, else the local key directory (created with a new key).
func openSigner(ctx context.Context, c AuditConfig) (signer, error) {
	if c.Vault.Key == "" {
		return attest.OpenKeyDir(c.KeyDir, attest.Algorithm(c.Algorithm), true)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return attest.NewVaultSigner(ctx, attest.VaultConfig{Address: c.Vault.Address, Token: os.Getenv("VAULT_TOKEN"),
		TokenFile: c.Vault.TokenFile, TransitPath: c.Vault.TransitPath, Key: c.Vault.Key})
}

// Run serves until ctx ends or a task fails; the first failure stops all.
func (m *Main) Run(ctx context.Context) error {
	if m.server == nil {
		return errors.New("Run called before a successful Open")
	}
	g, ctx := errgroup.WithContext(ctx)
	if m.repl != nil {
		stopped := make(chan struct{})
		defer close(stopped)
		go m.etcdStopDeadline(ctx, stopped)
	}
	// The checkpointer signs its last checkpoint after the server has
	// stopped, so that it covers every entry of every answered call.
	cpCtx, cpCancel := context.WithCancel(context.WithoutCancel(ctx))
	g.Go(func() error {
		defer cpCancel()
		return m.server.Serve(ctx, m.grpcLis)
	})
	// Background work that must happen once per deployment: here, or on
	// the elected leader of the replicas, under its term's fence.
	var leaderWork []func(context.Context)
	once := func(fn func(context.Context)) {
		if m.repl == nil {
			g.Go(func() error { fn(ctx); return nil })
			return
		}
		leaderWork = append(leaderWork, fn)
	}
	if m.repl == nil {
		g.Go(func() error {
			cp := &audit.Checkpointer{Log: m.audit, Interval: m.Config.Audit.checkpointInterval(),
				OnError: func(err error) { m.log.Error("audit checkpoint not signed; retrying", "err", err) }}
			if err := cp.Run(cpCtx); err != nil {
				return fmt.Errorf("audit checkpoints: %w", err)
			}
			return nil
		})
	} else {
		cpCancel() // the leader signs, while it leads
		once(func(ctx context.Context) {
			cp := &audit.Checkpointer{Log: m.audit, Interval: m.Config.Audit.checkpointInterval(),
				OnError: func(err error) { m.log.Error("audit checkpoint not signed; retrying", "err", err) }}
			_ = cp.Run(ctx)
		})
		g.Go(func() error { return m.seq.serve(ctx) })
		g.Go(func() error { return m.peers.relay(ctx, m.agent, m.hub, m.log.Warn) })
		g.Go(func() error { return m.repl.followLog(ctx, m.audit) })
		once(m.reconcileRotations)
		if t, _ := m.Config.Etcd.tail(); t.every > 0 { // checked by validate
			g.Go(func() error { m.repl.reportCopy(ctx, m.audit, t, &m.tail, m.log); return nil })
			once(func(ctx context.Context) { m.repl.trimLog(ctx, m.audit, t, &m.tail, m.log) })
		}
	}
	if m.reloader != nil && m.repl != nil {
		once(func(ctx context.Context) { _ = m.reloader.Run(ctx) })
	} else if m.reloader != nil {
		g.Go(func() error { return m.reloader.Run(ctx) })
	}
	once(func(ctx context.Context) {
		// Grants issued under an earlier policy or records (before a
		// restart, or before this replica led) are decided again under
		// those serving now.
		st := m.engine.Status()
		m.redecider.redecide(ctx, gateway.Change{All: true, Cause: fmt.Sprintf("gateway start under policy revision %s (digest %s)", st.Revision, st.Digest)})
		_ = m.redecider.Run(ctx)
	})
	g.Go(func() error { return m.keys.Run(ctx, nil) })
	if d := m.Config.Audit.complianceInterval(); d > 0 {
		once(func(ctx context.Context) { every(ctx, d, func() { m.attestCompliance(ctx) }) })
	}
	reconcileEvery, _ := time.ParseDuration(m.Config.Targets.ReconcileInterval)
	lastWaiting := 0
	sweep := func(ctx context.Context) {
		if n, err := m.lease.Expire(ctx); err != nil {
			m.log.Warn("expired grants not swept", "err", err)
		} else if n > 0 {
			m.log.Info("expired grants ended", "count", n)
		}
		// Data keys past their class's reencrypt_every: re-encrypted
		// once their subsystem is idle.
		started, waiting, err := m.server.ReencryptDue(ctx)
		if err != nil {
			m.log.Warn("scheduled re-encryption check failed", "err", err)
		}
		if started > 0 {
			m.log.Info("scheduled re-encryptions begun", "count", started)
		}
		if waiting != lastWaiting && waiting > 0 {
			m.log.Warn("data keys past their re-encryption period wait for their subsystems' grants to end", "count", waiting)
		}
		lastWaiting = waiting
	}
	reconcile := func(ctx context.Context) {
		// Every replica converges the targets whose agents it serves.
		if err := m.agent.Reconcile(ctx); err != nil {
			m.log.Warn("target reconcile failed", "err", err)
		}
	}
	if m.repl == nil {
		g.Go(func() error {
			every(ctx, reconcileEvery, func() { sweep(ctx); reconcile(ctx) })
			return nil
		})
	} else {
		once(func(ctx context.Context) {
			sweep(ctx) // a new leader sweeps at once: the last one may have died mid-period
			if ctx.Err() == nil {
				m.log.Info("swept at the start of this replica's term")
			}
			every(ctx, reconcileEvery, func() { sweep(ctx) })
		})
		g.Go(func() error {
			every(ctx, reconcileEvery, func() { reconcile(ctx) })
			return nil
		})
	}
	g.Go(func() error {
		// Ended grants whose target did not follow: tell it again until it
		// does (a remote agent reconnecting, a driver back from an error).
		last := 0
		every(ctx, settleInterval, func() {
			if m.db.PendingRemovalCount() == 0 {
				last = 0
				return
			}
			n, err := m.lease.Settle(ctx)
			if n != last {
				if n > 0 {
					m.log.Warn("grants ended, their hosts not yet removed from the targets; retrying", "pending", n, "err", err)
				} else {
					m.log.Info("pending removals settled: the targets removed the ended grants' hosts")
				}
				last = n
			}
		})
		return nil
	})
	if m.repl != nil {
		g.Go(func() error {
			return ignoreCanceled(m.repl.elector.Run(ctx, func(t leader.Term) {
				// Every write and audit append of the term is fenced: a
				// former leader's are refused in etcd.
				fctx := audit.WithCondition(t.Ctx, t.Fence)
				// The store sequences once its copy has every change.
				if err := m.db.Lead(fctx); err != nil {
					m.log.Error("this replica won the election but cannot sequence; resigning", "term", t.Rev, "err", err)
					return
				}
				m.log.Info("this replica leads: it sequences the writes and runs the background work", "term", t.Rev, "peer", m.seq.advertise)
				var wg sync.WaitGroup
				for _, fn := range leaderWork {
					wg.Add(1)
					go func() { defer wg.Done(); fn(fctx) }()
				}
				wg.Wait()
				m.log.Warn("this replica no longer leads the background work", "term", t.Rev)
			}))
		})
	}
	if r, ok := m.auditKey.(interface{ Refresh(context.Context) error }); ok {
		// A Vault signing key: pick up a rotated key version or a replaced
		// token file every minute.
		g.Go(func() error {
			every(ctx, time.Minute, func() {
				if err := r.Refresh(ctx); err != nil {
					m.log.Warn("audit signer refresh failed; signing with the pinned version", "err", err)
				}
			})
			return nil
		})
	}
	if m.httpSrv != nil {
		g.Go(func() error {
			errc := make(chan error, 1)
			go func() { errc <- m.httpSrv.Serve(m.httpLis) }()
			select {
			case err := <-errc:
				return fmt.Errorf("http: %w", err)
			case <-ctx.Done():
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return m.httpSrv.Shutdown(sctx)
			}
		})
	}
	err := g.Wait()
	m.log.Info("nvmegated stopped")
	return err
}

// stopTimeout is the stop's deadline: how long the graceful stop waits for
// the calls in flight before it ends them, and a replica for whatever
// still waits on etcd.
const stopTimeout = 10 * time.Second

// etcdStopDeadline aborts the etcd client stopTimeout after ctx ends,
// unless Run returned (stopped) before. The calls the graceful stop ends
// return on their own, but not what waits on etcd under a context of its
// own — a write that once begun runs to its end, the elector's campaign —
// and the etcd client waits for a member to be ready as long as a call's
// context lasts: while etcd was unreachable, a replica stopped never
// (issue 29, defect 6). Aborted, the client fails every such call at once.
func (m *Main) etcdStopDeadline(ctx context.Context, stopped <-chan struct{}) {
	select {
	case <-stopped:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		m.log.Warn("stopping: calls still wait on etcd; ending them", "after", stopTimeout)
		m.repl.abort()
		if m.seq != nil && m.seq.client != nil {
			m.seq.client.Abort() // writes waiting for a leader
		}
	}
}

// GRPCAddr is the bound gRPC address, after Open.
func (m *Main) GRPCAddr() string {
	if m.grpcLis == nil {
		return ""
	}
	return m.grpcLis.Addr().String()
}

// HTTPAddr is the bound metrics/health address, after Open; "" if off.
func (m *Main) HTTPAddr() string {
	if m.httpLis == nil {
		return ""
	}
	return m.httpLis.Addr().String()
}

// Close releases what Open acquired; safe after a failed Open.
func (m *Main) Close() error {
	var errs []error
	if m.grpcLis != nil {
		m.grpcLis.Close() // already closed by a graceful stop; error ignored
	}
	if m.httpLis != nil {
		m.httpLis.Close()
	}
	if m.source != nil {
		errs = append(errs, m.source.Close())
	}
	if m.db != nil {
		errs = append(errs, m.db.Close())
	}
	if m.keyStore != nil {
		errs = append(errs, m.keyStore.Close())
	}
	if m.audit != nil {
		errs = append(errs, m.audit.Close())
	}
	if m.seq != nil {
		m.seq.close()
	}
	if m.repl != nil {
		errs = append(errs, m.repl.close())
	}
	if m.Config.ReadyFile != "" {
		os.Remove(m.Config.ReadyFile)
	}
	return errors.Join(errs...)
}

// ReadyInfo is the content of the ready file.
type ReadyInfo struct {
	GRPC        string `json:"grpc"`
	HTTP        string `json:"http,omitempty"`
	TrustDomain string `json:"trust_domain"`
	PID         int    `json:"pid"`
}

func (m *Main) writeReadyFile() error {
	data, _ := json.Marshal(ReadyInfo{GRPC: m.GRPCAddr(), HTTP: m.HTTPAddr(), TrustDomain: m.Config.TrustDomain, PID: os.Getpid()})
	tmp := m.Config.ReadyFile + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("ready file: %w", err)
	}
	return os.Rename(tmp, m.Config.ReadyFile)
}

func (m *Main) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		// Healthy means the identity source yields an SVID that is valid
		// now: without one no handshake can succeed.
		svid, err := m.source.GetX509SVID()
		if err != nil || len(svid.Certificates) == 0 {
			http.Error(w, "no SVID", http.StatusServiceUnavailable)
			return
		}
		if leaf := svid.Certificates[0]; time.Now().After(leaf.NotAfter) {
			http.Error(w, "SVID expired at "+leaf.NotAfter.UTC().Format(time.RFC3339), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if m.Config.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func newLogger(w io.Writer, c LogConfig) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
