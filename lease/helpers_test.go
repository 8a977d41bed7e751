package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

const (
	targetID = "stor-eu-1"
	sub1     = "nqn.2026-01.io.nvmegate.test:acme-train"
	sub2     = "nqn.2026-01.io.nvmegate.test:acme-ckpt"
	jobID    = "job-1"
	node1    = "spiffe://nvmegate.test/node/acme-gpu-1"
	node2    = "spiffe://nvmegate.test/node/acme-gpu-2"
	admin    = "spiffe://nvmegate.test/admin/ops"
	digest   = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	keyScope = "target:" + targetID // nvmet keys a host once per target
)

var hostNQNs = map[string]string{
	node1: "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000",
	node2: "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000",
}

// clock is the fake clock every part shares: expiry is driven by
// advancing it, never by sleeping.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// world is a lifecycle over real parts in a temp dir: bbolt, the local
// key store and manager, the audit log, and the target agent with the
// nvmet driver writing a configfs-shaped tree. No gRPC.
type world struct {
	t        *testing.T
	ctx      context.Context
	clock    *clock
	db       *store.DB
	keys     *keys.Manager
	log      *audit.Log
	agent    *targetagent.Agent
	configfs string
	lc       *lease.Lifecycle
}

// newWorld builds the world with an nvmet target holding sub1 and sub2,
// and job-1 admitting node1 and node2 to both. wrap, if set, puts
// something between the lifecycle and the agent (or the log).
func newWorld(t *testing.T, wrap ...func(w *world, c *lease.Config)) *world {
	t.Helper()
	return openWorld(t, true, wrap...)
}

// newPlainWorld is newWorld with a store that is not journaled (a
// replica's is not): entries are appended before the commits they record.
func newPlainWorld(t *testing.T, wrap ...func(w *world, c *lease.Config)) *world {
	t.Helper()
	return openWorld(t, false, wrap...)
}

func openWorld(t *testing.T, journaled bool, wrap ...func(w *world, c *lease.Config)) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	dir := t.TempDir()
	w := &world{t: t, ctx: ctx, clock: &clock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}, configfs: filepath.Join(dir, "configfs")}
	var err error
	ks, err := localstore.Open(filepath.Join(dir, "keys.db"), filepath.Join(dir, "keys.key"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	if w.keys, err = keys.NewManager(keys.Options{Backend: ks, Now: w.clock.Now}); err != nil {
		t.Fatal(err)
	}
	if w.log, err = audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/audit", Now: w.clock.Now}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.log.Close() })
	// Journaled, as one gateway's store is: its writes are sequenced in
	// the log, an opening's and an end's entries in their commits.
	opts := store.Options{Now: w.clock.Now}
	if journaled {
		opts.Journal = w.log
	}
	if w.db, err = store.Open(filepath.Join(dir, "store.db"), opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.db.Close() })
	driver := &nvmet.Driver{Root: filepath.Join(w.configfs, targetID)}
	w.agent = &targetagent.Agent{Store: w.db, Keys: w.keys, Now: w.clock.Now, Driver: func(t *nvmegate.Target) targetagent.Driver {
		if t.ID == targetID {
			return driver
		}
		return nil
	}}
	w.inventory()
	cfg := lease.Config{Grants: w.db, Inventory: w.db, Keys: w.keys, Audit: w.log, Targets: w.agent, Now: w.clock.Now,
		Logger: slog.New(slog.DiscardHandler)}
	for _, f := range wrap {
		f(w, &cfg)
	}
	if w.lc, err = lease.New(cfg); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) inventory() {
	w.t.Helper()
	w.must(w.db.CreateTarget(w.ctx, &nvmegate.Target{ID: targetID, Fabric: "fab-eu", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.10", ServiceID: "4420"}}}))
	for _, nqn := range []string{sub1, sub2} {
		w.must(w.db.CreateSubsystem(w.ctx, &nvmegate.Subsystem{NQN: nqn, TargetID: targetID, Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}))
		w.must(w.db.CreateNamespace(w.ctx, &nvmegate.Namespace{SubsystemNQN: nqn, NSID: 1, Tenant: "acme", Region: "eu-west",
			DataClass: "internal", Dataset: nvmegate.Dataset{Name: "common-crawl/2026-10", Digest: digest}}))
	}
	for _, n := range []string{node1, node2} { // the scopes say they are bound (scope)
		w.must(w.db.CreateHostBinding(w.ctx, &nvmegate.HostBinding{SPIFFEID: n, HostNQN: hostNQNs[n], Tenant: "acme"}))
	}
	w.must(w.db.CreateJob(w.ctx, &nvmegate.Job{ID: jobID, Tenant: "acme", Scheduler: "spiffe://nvmegate.test/tenant/acme/scheduler/slurm",
		Nodes: []string{node1, node2}, AllowedRegions: []string{"eu-west"}, ExpiresAt: w.clock.Now().Add(2 * time.Hour),
		Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: sub1, NSID: 1, Mode: nvmegate.ModeReadOnly}, {SubsystemNQN: sub2, NSID: 1, Mode: nvmegate.ModeReadWrite}}}))
}

// scope is the scope of node's call on subsystem sub, read from the store
// as the gateway's describe reads it.
func (w *world) scope(node, sub string) *nvmegate.Scope {
	w.t.Helper()
	j, err := w.db.Job(w.ctx, jobID)
	w.must(err)
	s, err := w.db.Subsystem(w.ctx, sub)
	w.must(err)
	t, err := w.db.Target(w.ctx, s.TargetID)
	w.must(err)
	n, err := w.db.Namespace(w.ctx, sub, 1)
	w.must(err)
	mode := ""
	for _, jn := range j.Namespaces {
		if jn.SubsystemNQN == sub && jn.NSID == 1 {
			mode = jn.Mode
		}
	}
	// The binding as describe reads it: the stored one, or the default.
	binding, bound := nvmegate.HostBinding{SPIFFEID: node, HostNQN: hostNQNs[node]}, false
	if b, err := w.db.HostBinding(w.ctx, node); err == nil {
		binding, bound = *b, true
	} else if nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		w.must(err)
	}
	return &nvmegate.Scope{Caller: node, Binding: binding, Bound: bound,
		JobID: jobID, Job: j, Member: true, SubsystemNQN: sub, Subsystem: s, Target: t,
		Namespaces: []nvmegate.ScopeNamespace{{Key: n.Key(), Namespace: n, Mode: mode, Target: t}}}
}

var decisions atomic.Int64

// request is node's connect (or renewal) on sub as policy allowed it, with
// obligations ob.
func (w *world) request(node, sub string, ob nvmegate.Obligations) lease.Request {
	return lease.Request{Scope: w.scope(node, sub), TTL: time.Hour, Decision: &nvmegate.Decision{Allow: true,
		ID: fmt.Sprintf("decision-%d", decisions.Add(1)), PolicyRevision: "sha256:test", Reasons: []string{"test allows"}, Obligations: ob}}
}

func (w *world) issue(node, sub string) lease.Issued {
	w.t.Helper()
	is, err := w.lc.Issue(w.ctx, w.request(node, sub, nvmegate.Obligations{}))
	w.must(err)
	return is
}

// grant is the stored grant id.
func (w *world) grant(id string) *nvmegate.Grant {
	w.t.Helper()
	g, err := w.db.Grant(w.ctx, id)
	w.must(err)
	return g
}

// entries are the log's entries of kind.
func (w *world) entries(kind audit.EventKind) []audit.Record {
	w.t.Helper()
	recs, _, err := w.log.Query(w.ctx, audit.Filter{Kinds: []audit.EventKind{kind}}, audit.Page{Size: 1000})
	w.must(err)
	return recs
}

// hostKey is the DH-HMAC-CHAP key the target holds for node's host ("" if
// none).
func (w *world) hostKey(node string) string {
	b, err := os.ReadFile(filepath.Join(w.configfs, targetID, "hosts", hostNQNs[node], "dhchap_key"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// allowed reports whether the target allows node's host on sub.
func (w *world) allowed(node, sub string) bool {
	_, err := os.Lstat(filepath.Join(w.configfs, targetID, "subsystems", sub, "allowed_hosts", hostNQNs[node]))
	return err == nil
}

// refusing is a target that refuses the next n programming runs ("disk
// on fire") and passes the others to next.
type refusing struct {
	next lease.Targets
	n    atomic.Int32
}

var errDiskOnFire = errors.New("disk on fire")

func (r *refusing) Program(ctx context.Context, id string, changed ...nvmegate.HostRef) error {
	if r.n.Add(-1) >= 0 {
		return errDiskOnFire
	}
	return r.next.Program(ctx, id, changed...)
}

func wantCode(t *testing.T, err error, code string, subs ...string) {
	t.Helper()
	if nvmegate.ErrorCode(err) != code {
		t.Fatalf("error %v (code %q), want code %s", err, nvmegate.ErrorCode(err), code)
	}
	for _, s := range subs {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not say %q", err, s)
		}
	}
}
