package main

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"sigs.k8s.io/yaml"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/authz"
)

// Config is the daemon's configuration: a YAML file (--config) overridden by
// flags. Zero values mean the documented defaults.
type Config struct {
	// Listen is the gRPC address (mTLS). Default 127.0.0.1:7443.
	Listen string `json:"listen"`
	// HTTPListen serves /metrics and /healthz, plain HTTP: keep it on a
	// management network. Default 127.0.0.1:7080; "off" disables it.
	HTTPListen string `json:"http_listen"`
	// Pprof adds Go's profiler at /debug/pprof/ on the HTTP listener (for
	// profiling under load; it exposes internals, so off by default).
	Pprof bool `json:"pprof"`
	// MaxInFlight bounds the calls worked on at once (default 256); more
	// wait for a slot until their deadline, so that a storm cannot take the
	// gateway's memory.
	MaxInFlight int `json:"max_inflight"`
	// MaxInFlightPerIdentity bounds one caller's (one SPIFFE ID's) calls
	// under way, working or waiting for a slot: default max_inflight/8 (32
	// of 256), at most max_inflight; -1 none. A call past it is refused
	// RESOURCE_EXHAUSTED at once, so that one auditor or node holding slow
	// calls open cannot take the slots every node's connect needs.
	MaxInFlightPerIdentity int `json:"max_inflight_per_identity"`
	// MaxInFlightPerRole bounds the calls under way of all the callers of
	// a role together, by role (admin, auditor, scheduler, node, target,
	// gateway, unknown). A role not listed keeps its default: admin,
	// auditor and scheduler max_inflight/4 each, unknown max_inflight/16,
	// node, target and gateway none (a cluster's start is thousands of
	// node identities at once; a connect waits for its target agent's
	// acknowledgement). -1 lifts a role's bound.
	MaxInFlightPerRole map[string]int `json:"max_inflight_per_role"`
	// TrustDomain of the gateway and every caller, e.g. "example.org".
	// Callers of other trust domains fail the TLS handshake. Required.
	TrustDomain string `json:"trust_domain"`
	// StateDir holds the inventory database. Required.
	StateDir string `json:"state_dir"`
	// Identity says where the gateway's own SVID and the trust bundle come from.
	Identity IdentityConfig `json:"identity"`
	// Policy selects the Rego policy; the embedded default when unset.
	Policy PolicyConfig `json:"policy"`
	// Keys configures the key store and the rotation of access roots.
	Keys KeysConfig `json:"keys"`
	// Audit configures the audit log and its checkpoint signing key.
	Audit AuditConfig `json:"audit"`
	// Targets configures the embedded target agent.
	Targets TargetsConfig `json:"targets"`
	// Log configures slog output on stderr.
	Log LogConfig `json:"log"`
	// Runtime tunes Go's garbage collector for the daemon.
	Runtime RuntimeConfig `json:"runtime"`
	// ReadyFile, if set, is written with the bound addresses (JSON) once the
	// gateway accepts connections; scripts wait for it.
	ReadyFile string `json:"ready_file"`
	// Etcd, if its endpoints are set, makes this gateway one of several
	// replicas sharing one store and one audit log in etcd (HA). Unset:
	// a single gateway on its own bbolt files.
	Etcd EtcdConfig `json:"etcd"`
}

// EtcdConfig connects the gateway to the etcd cluster its replicas share.
// The files are read at start; use mTLS (CA, cert and key) in production:
// etcd holds the inventory, the grants and the audit log (no key
// material), and whoever may write it may grant access.
type EtcdConfig struct {
	// Endpoints of the etcd members, e.g. ["https://etcd-0:2379", …].
	Endpoints []string `json:"endpoints"`
	// CACert verifies the members' certificates; Cert and Key are this
	// replica's client certificate (mTLS). All or none.
	CACert string `json:"ca_cert"`
	Cert   string `json:"cert"`
	Key    string `json:"key"`
	// Prefix of every key the gateway writes. Default "/nvmegate/".
	Prefix string `json:"prefix"`
	// Name of this replica in the leader election. Default the host name.
	Name string `json:"name"`
	// LeaseTTL is the leader's session lease, in seconds: how long a dead
	// or paused leader holds the background work before another replica
	// takes it. Default 10.
	LeaseTTL int `json:"lease_ttl"`
	// DialTimeout bounds the first connection; a Go duration, default 10s.
	DialTimeout string `json:"dial_timeout"`
	// LogGroupWait bounds how long a commit of the audit log to etcd
	// waits for appends still arriving (audit.Options.GroupWait): a Go
	// duration up to 10ms, default 500µs; "off" sends each commit as soon
	// as the one before is answered.
	LogGroupWait string `json:"log_group_wait"`
	// PeerListen is where this replica takes the writes the others
	// forward to it while it leads (gRPC, mutual TLS between the
	// replicas' SVIDs). Default: listen's host, on a port the system
	// picks (the election publishes it).
	PeerListen string `json:"peer_listen"`
	// PeerAdvertise is the address the other replicas reach PeerListen
	// at. Default: the bound address, with the host name where it listens
	// on every address.
	PeerAdvertise string `json:"peer_advertise"`
	// Peers are the SPIFFE IDs of the other replicas, where they differ
	// from this replica's own (by default every replica runs as one ID).
	Peers []string `json:"peers"`
	// LogTrimEvery is how often the leader trims the audit log in etcd to
	// its tail (a Go duration, default 10s; "off" never trims, and etcd
	// then grows until its quota stops every write). The history lives on
	// in the replicas' copies, and a copy that lacks it fetches it from
	// the leader's.
	LogTrimEvery string `json:"log_trim_every"`
	// LogKeep is the entries of the log etcd keeps behind its head however
	// far the copies are (default 16384): a replica that restarts within
	// that reads what it missed from etcd.
	LogKeep int `json:"log_keep"`
	// LogCopies is how many live replicas' copies must hold an entry on
	// their disks before etcd lets it go (default 2, at most the
	// replicas): a deployment of one replica on etcd sets 1 to trim.
	LogCopies int `json:"log_copies"`
}

// tail is how the leader keeps etcd's log to its tail: how often, how
// many entries behind the head, and how many copies must hold the rest.
type tail struct {
	every  time.Duration // 0: never
	keep   uint64
	copies int
}

// tail is the trim's settings, defaults filled in.
func (e EtcdConfig) tail() (tail, error) {
	t := tail{every: 10 * time.Second, keep: 16384, copies: 2}
	switch e.LogTrimEvery {
	case "":
	case "off":
		t.every = 0
	default:
		d, err := time.ParseDuration(e.LogTrimEvery)
		if err != nil || d < time.Second {
			return t, fmt.Errorf("etcd.log_trim_every must be a Go duration of at least 1s, or \"off\", got %q", e.LogTrimEvery)
		}
		t.every = d
	}
	if e.LogKeep < 0 {
		return t, fmt.Errorf("etcd.log_keep must not be negative, got %d", e.LogKeep)
	} else if e.LogKeep > 0 {
		t.keep = uint64(e.LogKeep)
	}
	if e.LogCopies < 0 {
		return t, fmt.Errorf("etcd.log_copies must not be negative, got %d", e.LogCopies)
	} else if e.LogCopies > 0 {
		t.copies = e.LogCopies
	}
	return t, nil
}

// groupWait is LogGroupWait as audit.Options takes it: 0 for the
// default, negative for off.
func (e EtcdConfig) groupWait() (time.Duration, error) {
	switch e.LogGroupWait {
	case "":
		return 0, nil
	case "off":
		return -1, nil
	}
	d, err := time.ParseDuration(e.LogGroupWait)
	if err != nil || d <= 0 || d > 10*time.Millisecond {
		return 0, fmt.Errorf("etcd.log_group_wait must be a Go duration above 0 and at most 10ms, or \"off\", got %q", e.LogGroupWait)
	}
	return d, nil
}

// enabled says whether the gateway runs replicated on etcd.
func (e EtcdConfig) enabled() bool { return len(e.Endpoints) > 0 }

func (e EtcdConfig) validate() error {
	if !e.enabled() {
		return nil
	}
	tls := []string{e.CACert, e.Cert, e.Key}
	set := 0
	for _, f := range tls {
		if f != "" {
			set++
		}
	}
	if set != 0 && set != 3 {
		return errors.New("etcd: ca_cert, cert and key must all be set (mTLS), or none")
	}
	if e.LeaseTTL < 0 {
		return fmt.Errorf("etcd.lease_ttl must be positive, got %d", e.LeaseTTL)
	}
	if e.DialTimeout != "" {
		if d, err := time.ParseDuration(e.DialTimeout); err != nil || d <= 0 {
			return fmt.Errorf("etcd.dial_timeout must be a positive duration, got %q", e.DialTimeout)
		}
	}
	if e.Prefix != "" && !strings.HasSuffix(e.Prefix, "/") {
		return fmt.Errorf("etcd.prefix must end with '/', got %q", e.Prefix)
	}
	if e.PeerListen != "" {
		if _, _, err := net.SplitHostPort(e.PeerListen); err != nil {
			return fmt.Errorf("etcd.peer_listen must be host:port, got %q", e.PeerListen)
		}
	}
	for _, p := range e.Peers {
		if _, err := spiffeid.FromString(p); err != nil {
			return fmt.Errorf("etcd.peers: %q: %w", p, err)
		}
	}
	if _, err := e.tail(); err != nil {
		return err
	}
	_, err := e.groupWait()
	return err
}

// RuntimeConfig tunes the garbage collector. A connect allocates most of
// what it touches only for the call (policy evaluation above all), so the
// collector's pace decides much of the tail: a higher GC percent collects
// less often, and a soft memory limit keeps that from costing memory when
// the live heap grows. GOGC and GOMEMLIMIT in the environment win over both.
type RuntimeConfig struct {
	// GCPercent is GOGC's value; 0 means the default, 400; negative turns
	// the percentage-driven collector off (the memory limit still applies).
	GCPercent int `json:"gc_percent"`
	// MemoryLimit is the soft limit of the Go heap and runtime, e.g.
	// "768MiB" (the default) or "4GiB"; "off" leaves the runtime's. Set it
	// to about three quarters of the memory the daemon may use.
	MemoryLimit string `json:"memory_limit"`
}

// defaultMemoryLimit keeps a storm's heap under a GiB of RSS.
const defaultMemoryLimit = 768 << 20

// memoryLimit parses MemoryLimit (validated by validate); 0 means off.
func (r RuntimeConfig) memoryLimit() (int64, error) {
	switch r.MemoryLimit {
	case "":
		return defaultMemoryLimit, nil
	case "off":
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(r.MemoryLimit, u.suffix); ok {
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil || n <= 0 || n > math.MaxInt64/u.mult {
				break
			}
			return n * u.mult, nil
		}
	}
	return 0, fmt.Errorf("runtime.memory_limit must be a size such as 768MiB or 4GiB, or off; got %q", r.MemoryLimit)
}

// apply sets the collector's pace, unless the environment already did.
func (r RuntimeConfig) apply(getenv func(string) string) {
	if getenv("GOGC") == "" {
		pct := r.GCPercent
		if pct == 0 {
			pct = 400
		}
		debug.SetGCPercent(pct)
	}
	if getenv("GOMEMLIMIT") == "" {
		if n, err := r.memoryLimit(); err == nil && n > 0 {
			debug.SetMemoryLimit(n)
		}
	}
}

// IdentityConfig selects the SVID source: the SPIFFE Workload API (SPIRE) in
// production, or PEM files for development (re-read when they change).
type IdentityConfig struct {
	// SPIFFESocket is the Workload API address, e.g. unix:///run/spire/agent.sock.
	SPIFFESocket string `json:"spiffe_socket"`
	// SPIFFEID picks the gateway's SVID when the Workload API offers the
	// process several; "" takes the first.
	SPIFFEID string `json:"spiffe_id"`
	// Cert, Key and Bundle are PEM files: SVID chain, its key, CA bundle.
	Cert   string `json:"cert"`
	Key    string `json:"key"`
	Bundle string `json:"bundle"`
}

// PolicyConfig selects where the policy comes from. A directory or bundle
// file is checked again every ReloadInterval and a new revision is swapped
// in after it compiles and passes its self-test; a broken one is refused and
// logged, and the serving policy stays.
type PolicyConfig struct {
	// Dir is a directory of .rego files, data.json files and selftest.json.
	Dir string `json:"dir"`
	// Bundle is an OPA bundle file (.tar.gz).
	Bundle string `json:"bundle"`
	// ReloadInterval is a Go duration; default 5s.
	ReloadInterval string `json:"reload_interval"`
}

// reloadInterval parses ReloadInterval (validated by validate).
func (p PolicyConfig) reloadInterval() time.Duration {
	d, err := time.ParseDuration(p.ReloadInterval)
	if err != nil {
		return 5 * time.Second
	}
	return d
}

// KeysConfig selects the key store (local by default) and the timing of
// the key manager. Durations are Go durations.
type KeysConfig struct {
	// Backend is "local" (default: a bbolt file sealed under a key file in
	// the state dir) or "vault".
	Backend string `json:"backend"`
	// LocalPath and LocalKeyFile locate the local store; defaults
	// <state_dir>/keys.db and <state_dir>/keys.key (0600, created).
	LocalPath    string `json:"local_path"`
	LocalKeyFile string `json:"local_key_file"`
	// Vault configures the vault backend.
	Vault VaultKeysConfig `json:"vault"`
	// RotationPeriod of access roots (default 720h); Grace of a superseded
	// root (default 1h); RefreshInterval of the cache (default 30s);
	// MaxStaleness past which no credentials are issued (default 5m).
	RotationPeriod string `json:"rotation_period"`
	// DataKeyRotationPeriod of namespace KEKs (default 2160h).
	DataKeyRotationPeriod string `json:"data_key_rotation_period"`
	Grace                 string `json:"grace"`
	RefreshInterval       string `json:"refresh_interval"`
	MaxStaleness          string `json:"max_staleness"`
}

// VaultKeysConfig is the vault key backend: address, one way to log in,
// mounts and prefix (defaults secret, transit, nvmegate, matching
// deploy/vault/nvmegate.hcl).
type VaultKeysConfig struct {
	Address   string        `json:"address"`
	CACert    string        `json:"ca_cert"`
	TokenFile string        `json:"token_file"`
	AppRole   *VaultAppRole `json:"approle"`
	// Cert logs in with the gateway's own SVID (cert auth).
	Cert         *VaultCertAuth `json:"cert"`
	KVMount      string         `json:"kv_mount"`
	TransitMount string         `json:"transit_mount"`
	Prefix       string         `json:"prefix"`
}

// VaultAppRole is an AppRole login (deploy/vault/setup.sh approle DIR).
type VaultAppRole struct {
	RoleID       string `json:"role_id"`
	SecretIDFile string `json:"secret_id_file"`
	Mount        string `json:"mount"` // default "approle"
}

// VaultCertAuth is a TLS certificate login with the gateway's SVID files.
type VaultCertAuth struct {
	Mount string `json:"mount"` // default "cert"
	Name  string `json:"name"`  // the cert role; "" lets Vault match
}

// durations parses the key manager's durations (validated by validate).
func (k KeysConfig) durations() (rotation, dataKeys, grace, refresh, stale time.Duration) {
	p := func(s string) time.Duration { d, _ := time.ParseDuration(s); return d }
	return p(k.RotationPeriod), p(k.DataKeyRotationPeriod), p(k.Grace), p(k.RefreshInterval), p(k.MaxStaleness)
}

// TargetsConfig configures the target agent embedded in the gateway, which
// programs every target with driver nvmet: each under NVMetRoot/<target
// ID> (a directory tree for one machine and the demo).
type TargetsConfig struct {
	// NVMetRoot is the root of the nvmet trees; default <state_dir>/configfs.
	NVMetRoot string `json:"nvmet_root"`
	// ReconcileInterval is how often every target is reprogrammed (expired
	// grants and roots past their grace leave); default 30s.
	ReconcileInterval string `json:"reconcile_interval"`
	// Remote lists the targets programmed only by their own agent
	// (nvmegate-target): while it is not connected, nothing is programmed
	// for them and Connect fails, never falling back to a local tree.
	Remote []string `json:"remote"`
	// AckTimeout bounds how long a remote agent may take to acknowledge a
	// state; a stream that misses it is ended and its agent reconnects.
	// Raise it for targets whose whole state takes long to apply; default
	// 10s.
	AckTimeout string `json:"ack_timeout"`
	// SPDK names, per target ID, the JSON-RPC socket and key directory of
	// each target with driver spdk.
	SPDK map[string]SPDKTarget `json:"spdk"`
}

// SPDKTarget locates one SPDK nvmf_tgt.
type SPDKTarget struct {
	Socket string `json:"socket"`  // e.g. /var/tmp/spdk.sock
	KeyDir string `json:"key_dir"` // absolute; key files are written here (0600)
}

// AuditConfig configures the signed audit log (bbolt) and the local key
// that signs its checkpoints.
type AuditConfig struct {
	// Path of the log file. Default <state_dir>/audit.db.
	Path string `json:"path"`
	// Origin names the log in its checkpoints (C2SP tlog-checkpoint), e.g.
	// "gw1.example.org/audit". Default "<trust_domain>/nvmegate-audit".
	// Fixed when the log is created.
	Origin string `json:"origin"`
	// KeyDir holds the checkpoint signing keys, one file per version
	// (created with a new key if empty). Default <state_dir>/audit-keys.
	KeyDir string `json:"key_dir"`
	// Algorithm of a newly created signing key: "ed25519" (default) or
	// "ecdsa-p256".
	Algorithm string `json:"algorithm"`
	// CheckpointInterval is how often a checkpoint is signed while entries
	// arrive; a Go duration, default 1s.
	CheckpointInterval string `json:"checkpoint_interval"`
	// ComplianceInterval is how often the gateway signs a compliance
	// attestation (kept under the state directory's compliance/ and
	// recorded in the log); a Go duration, default 1h; "off" makes none
	// on a schedule (on demand they still are).
	ComplianceInterval string `json:"compliance_interval"`
	// Vault, if its key is set, signs checkpoints with a Vault Transit key
	// instead of KeyDir's local key.
	Vault VaultSignerConfig `json:"vault"`
}

// VaultSignerConfig names a Vault Transit signing key (type ed25519 or
// ecdsa-p256) for checkpoints.
type VaultSignerConfig struct {
	// Address of Vault; default $VAULT_ADDR.
	Address string `json:"address"`
	// TokenFile holds the Vault token; default $VAULT_TOKEN.
	TokenFile string `json:"token_file"`
	// TransitPath is the Transit mount; default "transit".
	TransitPath string `json:"transit_path"`
	// Key is the Transit key name; empty means the local key.
	Key string `json:"key"`
}

// LogConfig configures logging.
type LogConfig struct {
	// Format is "text" (default) or "json".
	Format string `json:"format"`
	// Level is "debug", "info" (default), "warn" or "error".
	Level string `json:"level"`
}

// loadConfig reads a YAML config file; unknown fields are errors so that a
// typo does not silently fall back to a default.
func loadConfig(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("read config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

func (c *Config) setDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7443"
	}
	if c.HTTPListen == "" {
		c.HTTPListen = "127.0.0.1:7080"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Policy.ReloadInterval == "" {
		c.Policy.ReloadInterval = "5s"
	}
	k := &c.Keys
	if k.Backend == "" {
		k.Backend = "local"
	}
	if k.LocalPath == "" && c.StateDir != "" {
		k.LocalPath = filepath.Join(c.StateDir, "keys.db")
	}
	if k.LocalKeyFile == "" && c.StateDir != "" {
		k.LocalKeyFile = filepath.Join(c.StateDir, "keys.key")
	}
	for _, d := range []struct {
		p *string
		v string
	}{{&k.RotationPeriod, "720h"}, {&k.DataKeyRotationPeriod, "2160h"}, {&k.Grace, "1h"}, {&k.RefreshInterval, "30s"}, {&k.MaxStaleness, "5m"}} {
		if *d.p == "" {
			*d.p = d.v
		}
	}
	if c.Targets.NVMetRoot == "" && c.StateDir != "" {
		c.Targets.NVMetRoot = filepath.Join(c.StateDir, "configfs")
	}
	if c.Targets.AckTimeout == "" {
		c.Targets.AckTimeout = "10s"
	}
	if c.Targets.ReconcileInterval == "" {
		c.Targets.ReconcileInterval = "30s"
	}
	a := &c.Audit
	if a.Path == "" && c.StateDir != "" {
		a.Path = filepath.Join(c.StateDir, "audit.db")
	}
	if a.KeyDir == "" && c.StateDir != "" {
		a.KeyDir = filepath.Join(c.StateDir, "audit-keys")
	}
	if a.Origin == "" && c.TrustDomain != "" {
		a.Origin = c.TrustDomain + "/nvmegate-audit"
	}
	if a.Algorithm == "" {
		a.Algorithm = string(attest.Ed25519)
	}
	if a.CheckpointInterval == "" {
		a.CheckpointInterval = "1s"
	}
	if a.ComplianceInterval == "" {
		a.ComplianceInterval = "1h"
	}
}

// complianceInterval parses ComplianceInterval (validated by validate);
// 0 means off.
func (a AuditConfig) complianceInterval() time.Duration {
	d, err := time.ParseDuration(a.ComplianceInterval)
	if err != nil {
		return 0
	}
	return d
}

// checkpointInterval parses CheckpointInterval (validated by validate).
func (a AuditConfig) checkpointInterval() time.Duration {
	d, err := time.ParseDuration(a.CheckpointInterval)
	if err != nil {
		return time.Second
	}
	return d
}

// validateShares checks the callers' shares of the in-flight calls.
func (c *Config) validateShares() error {
	inFlight := cmp.Or(c.MaxInFlight, 256)
	if n := c.MaxInFlightPerIdentity; n < -1 || n > inFlight {
		return fmt.Errorf("max_inflight_per_identity must be 0 (the default, max_inflight/8), at most max_inflight (%d), or -1 for none; got %d", inFlight, n)
	}
	roles := []string{authz.RoleAdmin, authz.RoleAuditor, authz.RoleScheduler, authz.RoleNode, authz.RoleTarget, authz.RoleGateway, authz.RoleUnknown}
	for role, n := range c.MaxInFlightPerRole {
		if !slices.Contains(roles, role) {
			return fmt.Errorf("max_inflight_per_role: no role %q; roles are %s", role, strings.Join(roles, ", "))
		}
		if n < -1 || n == 0 {
			return fmt.Errorf("max_inflight_per_role.%s must be positive, or -1 for none; got %d", role, n)
		}
	}
	return nil
}

// validate checks the configuration once, before anything starts.
func (c *Config) validate() error {
	if c.MaxInFlight < 0 {
		return fmt.Errorf("max_inflight must be 0 (the default, 256) or positive, got %d", c.MaxInFlight)
	}
	if err := c.validateShares(); err != nil {
		return err
	}
	if _, err := c.Runtime.memoryLimit(); err != nil {
		return err
	}
	if c.TrustDomain == "" {
		return errors.New("trust_domain is required")
	}
	if _, err := spiffeid.TrustDomainFromString(c.TrustDomain); err != nil {
		return fmt.Errorf("trust_domain: %w", err)
	}
	if c.StateDir == "" {
		return errors.New("state_dir is required")
	}
	if err := c.Etcd.validate(); err != nil {
		return err
	}
	if c.Etcd.enabled() && c.Keys.Backend != "vault" {
		// Each replica's local key store would hold its own roots: a
		// host granted by one replica could not be renewed by another.
		return errors.New("etcd: replicas must share their keys: set keys.backend to vault")
	}
	id := c.Identity
	files := id.Cert != "" || id.Key != "" || id.Bundle != ""
	switch {
	case id.SPIFFESocket != "" && files:
		return errors.New("identity: set either spiffe_socket or cert/key/bundle, not both")
	case id.SPIFFESocket == "" && !files:
		return errors.New("identity: spiffe_socket or cert, key and bundle are required")
	case files && (id.Cert == "" || id.Key == "" || id.Bundle == ""):
		return errors.New("identity: cert, key and bundle must all be set")
	}
	if c.Policy.Dir != "" && c.Policy.Bundle != "" {
		return errors.New("policy: set dir or bundle, not both")
	}
	if d, err := time.ParseDuration(c.Policy.ReloadInterval); err != nil || d < 100*time.Millisecond {
		return fmt.Errorf("policy.reload_interval must be a duration of at least 100ms, got %q", c.Policy.ReloadInterval)
	}
	switch c.Keys.Backend {
	case "local":
	case "vault":
		v := c.Keys.Vault
		n := 0
		for _, set := range []bool{v.TokenFile != "", v.AppRole != nil, v.Cert != nil} {
			if set {
				n++
			}
		}
		if n > 1 {
			return errors.New("keys.vault: set one of token_file, approle, cert")
		}
	default:
		return fmt.Errorf("keys.backend must be local or vault, got %q", c.Keys.Backend)
	}
	for name, v := range map[string]string{"rotation_period": c.Keys.RotationPeriod, "data_key_rotation_period": c.Keys.DataKeyRotationPeriod} {
		if d, err := time.ParseDuration(v); err != nil || d == 0 {
			return fmt.Errorf("keys.%s must be a duration (negative: no scheduled rotation), got %q", name, v)
		}
	}
	for name, v := range map[string]string{"grace": c.Keys.Grace, "refresh_interval": c.Keys.RefreshInterval, "max_staleness": c.Keys.MaxStaleness} {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			return fmt.Errorf("keys.%s must be a positive duration, got %q", name, v)
		}
	}
	if _, _, _, refresh, stale := c.Keys.durations(); refresh*2 > stale {
		return fmt.Errorf("keys.refresh_interval (%s) must be at most half of keys.max_staleness (%s), or one failed refresh stops issuance", refresh, stale)
	}
	for id, t := range c.Targets.SPDK {
		if t.Socket == "" || !filepath.IsAbs(t.KeyDir) {
			return fmt.Errorf("targets.spdk.%s: socket and an absolute key_dir are required", id)
		}
	}
	if d, err := time.ParseDuration(c.Targets.AckTimeout); err != nil || d < 100*time.Millisecond {
		return fmt.Errorf("targets.ack_timeout must be a duration of at least 100ms, got %q", c.Targets.AckTimeout)
	}
	if d, err := time.ParseDuration(c.Targets.ReconcileInterval); err != nil || d < 100*time.Millisecond {
		return fmt.Errorf("targets.reconcile_interval must be a duration of at least 100ms, got %q", c.Targets.ReconcileInterval)
	}
	switch attest.Algorithm(c.Audit.Algorithm) {
	case attest.Ed25519, attest.ECDSAP256:
	default:
		return fmt.Errorf("audit.algorithm must be %s or %s, got %q", attest.Ed25519, attest.ECDSAP256, c.Audit.Algorithm)
	}
	if d, err := time.ParseDuration(c.Audit.CheckpointInterval); err != nil || d < 10*time.Millisecond || d > time.Hour {
		return fmt.Errorf("audit.checkpoint_interval must be a duration from 10ms to 1h, got %q", c.Audit.CheckpointInterval)
	}
	if d, err := time.ParseDuration(c.Audit.ComplianceInterval); c.Audit.ComplianceInterval != "off" && (err != nil || d < time.Minute) {
		return fmt.Errorf("audit.compliance_interval must be a duration of at least 1m, or off; got %q", c.Audit.ComplianceInterval)
	}
	if c.Audit.Origin == "" {
		return errors.New("audit.origin is required")
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		return fmt.Errorf("log.format must be text or json, got %q", c.Log.Format)
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log.level must be debug, info, warn or error, got %q", c.Log.Level)
	}
	return nil
}
