package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/targetagent"

	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/internal/netfreeze"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// startReplica runs one gateway replica of the dev trust domain in dir,
// on its own state directory, sharing the store and the audit log in etcd
// and the keys in Vault with the others.
func startReplica(t *testing.T, dir, name string, etcd []string, v *vaulttest.Server, role vaulttest.AppRole, tune func(*EtcdConfig), flags ...string) (*Main, func()) {
	t.Helper()
	m := NewMain()
	m.Stderr = io.Discard
	state := filepath.Join(dir, name)
	if err := m.ParseFlags(context.Background(), append([]string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--http-listen", "off",
		"--state-dir", state, "--ready-file", filepath.Join(state, "ready.json")}, flags...)); err != nil {
		t.Fatal(err)
	}
	m.Config.Keys.Backend = "vault"
	m.Config.Keys.Vault.Address = v.Addr
	m.Config.Keys.Vault.AppRole = &VaultAppRole{RoleID: role.RoleID, SecretIDFile: role.SecretIDFile}
	m.Config.Audit.KeyDir = filepath.Join(dir, "audit-keys") // one log, one signing key
	m.Config.Etcd = EtcdConfig{Endpoints: etcd, Name: name, LeaseTTL: 2}
	if tune != nil {
		tune(&m.Config.Etcd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Open(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: Run did not return", name)
		}
		if err := m.Close(); err != nil {
			t.Errorf("%s: Close: %v", name, err)
		}
	}
	t.Cleanup(stop)
	return m, stop
}

// fleet is one Vault, one etcd cluster and a dev trust domain, for the
// replicas a test starts on them.
type fleet struct {
	vault *vaulttest.Server
	etcd  *etcdtest.Cluster
	dir   string
	role  vaulttest.AppRole
	tune  func(*EtcdConfig) // if set, applied to every replica's
}

func newFleet(t *testing.T, members int) *fleet {
	t.Helper()
	f := &fleet{vault: vaulttest.Start(t), etcd: etcdtest.Start(t, members), dir: t.TempDir()}
	f.role = f.vault.SetUpAppRole(t, filepath.Join(f.dir, "approle"))
	return f
}

// replica starts replica name on every etcd member (startReplica).
func (f *fleet) replica(t *testing.T, name string, flags ...string) (*Main, func()) {
	t.Helper()
	return startReplica(t, f.dir, name, f.etcd.Endpoints, f.vault, f.role, f.tune, flags...)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// subsystemHosts lists the hosts allowed on subsystem sub of the nvmet
// tree at root (a target agent's driver).
func subsystemHosts(root, sub string) func() []string {
	return func() []string {
		ents, _ := os.ReadDir(filepath.Join(root, "subsystems", sub, "allowed_hosts"))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
}

// runAgent runs a target agent until the test ends.
func runAgent(t *testing.T, r *targetagent.Remote) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Two gateway replicas on one etcd serve one fabric: the inventory added
// through one is the other's, a job admitted on one is connected to on
// both, each sees the other's grants and audit entries, exactly one leads
// the background work, and when it stops the other takes over and serves
// on alone.
func TestTwoReplicasOnEtcd(t *testing.T) {
	f := newFleet(t, 1)
	dir := f.dir
	a, stopA := f.replica(t, "a")
	b, stopB := f.replica(t, "b")
	replicas := map[string]*Main{"a": a, "b": b}

	// The inventory added through a, the job admitted through b right
	// after.
	sub := acmeJob(t, dir, a.GRPCAddr(), b.GRPCAddr(), "stor-1")

	// One node connects through each replica; each replica programs its
	// target before answering.
	grants := map[string]*pb.Grant{}
	for node, m := range map[string]*Main{"acme-node-1": a, "acme-node-2": b} {
		resp, err := pb.NewAccessClient(devConn(t, m.GRPCAddr(), dir, node)).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		grants[node] = resp.Grant
		if hs := allowedHosts(t, m, sub); !contains(hs, resp.Grant.HostNqn) {
			t.Fatalf("%s: host %s not on the target after the connect (%v)", node, resp.Grant.HostNqn, hs)
		}
	}
	if grants["acme-node-1"].GrantId == grants["acme-node-2"].GrantId {
		t.Fatal("one grant for two nodes")
	}
	// Each replica serves both grants and both grant entries of the log.
	for name, m := range replicas {
		waitUntil(t, name+" serving both grants", func() bool {
			gs, err := m.db.ActiveGrants(ctxT(t))
			return err == nil && len(gs) == 2
		})
		waitUntil(t, name+"'s log copy holding the other's entries", func() bool {
			return m.audit.Size() == a.audit.Size() && m.audit.Size() == b.audit.Size()
		})
	}
	ra, _ := a.audit.RootAt(ctxT(t), a.audit.Size())
	rb, _ := b.audit.RootAt(ctxT(t), b.audit.Size())
	if ra != rb {
		t.Fatal("the replicas' log copies disagree")
	}

	// Exactly one leads.
	waitUntil(t, "a leader", func() bool { return a.repl.elector.Leading() != b.repl.elector.Leading() })
	stopLead, other := stopA, b
	if b.repl.elector.Leading() {
		stopLead, other = stopB, a
	}
	stopLead()
	waitUntil(t, "the other replica leading", other.repl.elector.Leading)

	// The survivor serves on: a renewal of the grant the stopped replica
	// issued, and a release.
	for node, g := range grants {
		ac := pb.NewAccessClient(devConn(t, other.GRPCAddr(), dir, node))
		if _, err := ac.Renew(ctxT(t), &pb.RenewRequest{GrantId: g.GrantId}); err != nil {
			t.Fatalf("%s: renew on the survivor: %v", node, err)
		}
		if _, err := ac.Release(ctxT(t), &pb.ReleaseRequest{GrantId: g.GrantId}); err != nil {
			t.Fatalf("%s: release on the survivor: %v", node, err)
		}
	}
	if gs, err := other.db.ActiveGrants(ctxT(t)); err != nil || len(gs) != 0 {
		t.Fatalf("active grants after the releases: %d %v", len(gs), err)
	}
}

// A target's agent streams from one replica; a node connects through the
// other, which answers only once the agent's replica has programmed the
// target and the agent acknowledged it; a release through it likewise.
// When the agent's replica stops, the agent reconnects to the other and
// the target keeps exactly the active grants' hosts.
func TestTargetBehindAnotherReplica(t *testing.T) {
	f := newFleet(t, 1)
	dir := f.dir
	a, _ := f.replica(t, "a", "--remote-targets", "stor-eu-1")
	b, stopB := f.replica(t, "b", "--remote-targets", "stor-eu-1")

	sub := acmeJob(t, dir, a.GRPCAddr(), a.GRPCAddr(), "stor-eu-1")

	// The target's agent, with the target's SVID, dialing the replicas in
	// order: b first, a once b is gone.
	res := manual.NewBuilderWithScheme("replicas")
	res.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: b.GRPCAddr()}, {Addr: a.GRPCAddr()}}})
	cert, key := devca.SVIDPaths(dir, "target-stor-eu-1")
	src, err := identity.NewFileSource(cert, key, devca.BundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(res.Scheme()+":///gateway", grpc.WithResolvers(res),
		grpc.WithTransportCredentials(identity.ClientCredentials(src, tlsconfig.AuthorizeID(spiffeid.RequireFromString("spiffe://nvmegate.test/gateway/nvmegated")))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	root := t.TempDir()
	runAgent(t, &targetagent.Remote{Conn: conn, Driver: &nvmet.Driver{Root: root}})
	waitUntil(t, "the agent attached to b", func() bool { return b.hub.Connected("stor-eu-1") })
	hosts := subsystemHosts(root, sub)
	// Through a, whose replica has no stream of the target: the answer
	// comes once b programmed it.
	resp, err := pb.NewAccessClient(devConn(t, a.GRPCAddr(), dir, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	if hs := hosts(); len(hs) != 1 || hs[0] != resp.Grant.HostNqn {
		t.Fatalf("hosts on the target when a answered: %v", hs)
	}
	resp2, err := pb.NewAccessClient(devConn(t, b.GRPCAddr(), dir, "acme-node-2")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewAccessClient(devConn(t, a.GRPCAddr(), dir, "acme-node-1")).Release(ctxT(t), &pb.ReleaseRequest{GrantId: resp.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	if hs := hosts(); len(hs) != 1 || hs[0] != resp2.Grant.HostNqn {
		t.Fatalf("hosts on the target when a answered the release: %v", hs)
	}

	// b goes; the agent moves to a and the target keeps node 2 alone.
	stopB()
	waitUntil(t, "the agent attached to a", func() bool { return a.hub.Connected("stor-eu-1") })
	waitUntil(t, "the target's state from a", func() bool {
		hs := hosts()
		return len(hs) == 1 && hs[0] == resp2.Grant.HostNqn
	})
	resp3, err := pb.NewAccessClient(devConn(t, a.GRPCAddr(), dir, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	if hs := hosts(); len(hs) != 2 || !contains(hs, resp3.Grant.HostNqn) {
		t.Fatalf("hosts after a reconnect through a: %v", hs)
	}
}

// hostsLog wraps a target's driver and keeps the hosts on the subsystem
// after every application, for a test that a released host never comes
// back, however briefly.
type hostsLog struct {
	targetagent.Driver
	hosts func() []string
	mu    sync.Mutex
	seen  [][]string
}

func (h *hostsLog) Apply(ctx context.Context, s fabric.State) error {
	err := h.Driver.Apply(ctx, s)
	h.note()
	return err
}

func (h *hostsLog) ApplyDelta(ctx context.Context, d fabric.Delta) error {
	err := h.Driver.ApplyDelta(ctx, d)
	h.note()
	return err
}

func (h *hostsLog) note() {
	hs := h.hosts()
	h.mu.Lock()
	h.seen = append(h.seen, hs)
	h.mu.Unlock()
}

func (h *hostsLog) since(i int) [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen[min(i, len(h.seen)):])
}

func (h *hostsLog) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen)
}

// Issue 29, defect 2, as the review did it on real replicas: a node
// connects through replica a; replica lag loses its etcd member; the
// release through a answers OK and the agent, on replica b, removes the
// host; b stops, and the agent's next replica in its list is lag. The
// released host must not come back: lag refuses the stream (it cannot
// pass its read barrier) and the agent moves on to a, whose state is
// current.
func TestReleasedHostStaysOffThroughALaggingReplica(t *testing.T) {
	f := newFleet(t, 3)
	dir, c := f.dir, f.etcd
	a, _ := f.replica(t, "a", "--remote-targets", "stor-eu-1")
	b, stopB := f.replica(t, "b", "--remote-targets", "stor-eu-1")
	lag, _ := startReplica(t, dir, "lag", c.Endpoints[2:], f.vault, f.role, nil, "--remote-targets", "stor-eu-1")
	sub := acmeJob(t, dir, a.GRPCAddr(), a.GRPCAddr(), "stor-eu-1")

	var replicas []grpc.ClientConnInterface
	for _, m := range []*Main{b, lag, a} {
		replicas = append(replicas, devConn(t, m.GRPCAddr(), dir, "target-stor-eu-1"))
	}
	root := t.TempDir()
	d := &hostsLog{Driver: &nvmet.Driver{Root: root}, hosts: subsystemHosts(root, sub)}
	runAgent(t, &targetagent.Remote{Replicas: replicas, Driver: d})
	waitUntil(t, "the agent attached to b", func() bool { return b.hub.Connected("stor-eu-1") })

	node := devConn(t, a.GRPCAddr(), dir, "acme-node-1")
	resp, err := pb.NewAccessClient(node).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	if hs := d.hosts(); !contains(hs, resp.Grant.HostNqn) {
		t.Fatalf("hosts on the target after the connect: %v", hs)
	}
	c.Stop(2) // lag's only etcd member
	if _, err := pb.NewAccessClient(node).Release(ctxT(t), &pb.ReleaseRequest{GrantId: resp.Grant.GrantId}); err != nil {
		t.Fatal(err)
	}
	if hs := d.hosts(); contains(hs, resp.Grant.HostNqn) {
		t.Fatalf("the released host is still on the target: %v", hs)
	}
	released := d.count()
	stopB()
	waitUntil(t, "the agent attached to a", func() bool { return a.hub.Connected("stor-eu-1") })
	if lag.hub.Connected("stor-eu-1") {
		t.Fatal("the lagging replica took the agent's stream")
	}
	for i, hs := range d.since(released) {
		if contains(hs, resp.Grant.HostNqn) {
			t.Fatalf("the released host came back on the target (application %d after the release: %v)", i+1, hs)
		}
	}
}

// Issue 29, defect 7: the agent's replica hangs (here its connection to
// the agent is frozen: open, nothing answered, as under SIGSTOP), and a
// grant is released through another replica. The release honestly says
// the removal is pending; the agent notices the silence, moves to the
// other replica, and the host leaves the target — target: within 10 s of
// the release.
func TestReleasedHostLeavesWhileTheAgentsReplicaHangs(t *testing.T) {
	f := newFleet(t, 1)
	dir := f.dir
	a, _ := f.replica(t, "a", "--remote-targets", "stor-eu-1")
	b, _ := f.replica(t, "b", "--remote-targets", "stor-eu-1")
	sub := acmeJob(t, dir, a.GRPCAddr(), a.GRPCAddr(), "stor-eu-1")

	hung := netfreeze.Start(t, b.GRPCAddr())
	root := t.TempDir()
	hosts := subsystemHosts(root, sub)
	runAgent(t, &targetagent.Remote{Replicas: []grpc.ClientConnInterface{devConn(t, hung.Addr(), dir, "target-stor-eu-1"), devConn(t, a.GRPCAddr(), dir, "target-stor-eu-1")},
		Driver: &nvmet.Driver{Root: root}})
	waitUntil(t, "the agent attached to b", func() bool { return b.hub.Connected("stor-eu-1") })

	node := pb.NewAccessClient(devConn(t, a.GRPCAddr(), dir, "acme-node-1"))
	resp, err := node.Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	if !contains(hosts(), resp.Grant.HostNqn) {
		t.Fatalf("hosts after the connect: %v", hosts())
	}
	hung.Freeze()
	start := time.Now()
	released := make(chan error, 1)
	go func() {
		_, err := node.Release(ctxT(t), &pb.ReleaseRequest{GrantId: resp.Grant.GrantId})
		released <- err
	}()
	for contains(hosts(), resp.Grant.HostNqn) {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the released host is still on the target %s after the release", time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
	gone := time.Since(start)
	// The release answers OK once the agent acknowledged through a, or
	// Unavailable ("removal pending") if it waited out its bound first:
	// never OK while the host was on the target.
	if err := <-released; err != nil && status.Code(err) != codes.Unavailable {
		t.Fatalf("release: %v", err)
	}
	t.Logf("the host left the target %s after the release", gone.Round(time.Millisecond))
}
