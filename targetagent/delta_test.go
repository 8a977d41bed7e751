package targetagent_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/fabric/nvmet/nvmettest"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// world is a store, a key manager and a clock with one target on them,
// and a small model of the gateway's grant lifecycle: each operation
// stores its grants as the gateway does and returns the host entries it
// changed.
type world struct {
	t      testing.TB
	ctx    context.Context
	db     *store.DB
	km     *keys.Manager
	clk    *clock
	rng    *rand.Rand
	target *nvmegate.Target
	subs   []string
	nodes  []string          // node SPIFFE IDs
	hostOf map[string]string // node → host NQN
	scope  func(sub string) string
	nvmet  bool
	n      int
}

func newWorld(t testing.TB, seed uint64, driver string, subs, nodes []string, hostOf map[string]string) *world {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	db, err := store.Open(filepath.Join(dir, "s.db"), store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ks, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	km, err := keys.NewManager(keys.Options{Backend: ks, Now: clk.Now, Grace: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, db: db, km: km, clk: clk, rng: rand.New(rand.NewPCG(seed, 5)), subs: subs, nodes: nodes, hostOf: hostOf,
		nvmet: driver == nvmegate.DriverNVMet}
	w.target = &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: driver, Ports: []nvmegate.Port{
		{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"},
		{ID: 2, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4421", SecureChannel: nvmegate.SecureChannelRequired}}}
	if err := db.CreateTarget(ctx, w.target); err != nil {
		t.Fatal(err)
	}
	for _, s := range subs {
		sub := &nvmegate.Subsystem{NQN: s, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1, 2}, DHCHAP: true, TLS: true}
		if err := db.CreateSubsystem(ctx, sub); err != nil {
			t.Fatal(err)
		}
		if err := db.CreateNamespace(ctx, &nvmegate.Namespace{SubsystemNQN: s, NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: "internal",
			Dataset: nvmegate.Dataset{Name: "ds", Digest: "sha256:" + strings.Repeat("a", 64)}, QoS: nvmegate.QoS{MaxIOPS: 1000}}); err != nil {
			t.Fatal(err)
		}
	}
	w.scope = func(sub string) string {
		return nvmegate.CredentialScope(w.target, &nvmegate.Subsystem{NQN: sub})
	}
	scopes := map[string]bool{}
	for _, s := range subs {
		scopes[w.scope(s)] = true
	}
	for sc := range scopes {
		if _, err := km.Rotate(ctx, sc, "test"); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func (w *world) version(scope string) uint64 {
	st, err := w.km.Status(w.ctx, scope)
	if err != nil {
		w.t.Fatal(err)
	}
	return st.Current
}

// entry gives g a random authentication (TLS only on SPDK targets, which
// cannot combine it with DH-HMAC-CHAP) at the current root version.
func (w *world) entry(g *nvmegate.Grant) {
	g.KeyVersion = w.version(g.Scope())
	g.DHCHAPHash = []string{"sha256", "sha384", "sha512"}[w.rng.IntN(3)]
	g.DHGroup = []string{"null", "ffdhe2048", "ffdhe3072"}[w.rng.IntN(3)]
	g.Bidirectional = w.rng.IntN(2) == 0
	g.TLS = false
	if !w.nvmet && w.rng.IntN(4) == 0 {
		g.TLS, g.DHCHAPHash, g.DHGroup, g.Bidirectional = true, "none", "", false
	}
}

func (w *world) active(node string) []*nvmegate.Grant {
	gs, err := w.db.NodeActiveGrants(w.ctx, node)
	if err != nil {
		w.t.Fatal(err)
	}
	var out []*nvmegate.Grant
	for _, g := range gs {
		if g.Active(w.clk.now) {
			out = append(out, g)
		}
	}
	return out
}

// sharing are node's other active grants on g's host entry (they move
// with g, as in the gateway).
func (w *world) sharing(g *nvmegate.Grant, skip func(*nvmegate.Grant) bool) []*nvmegate.Grant {
	var out []*nvmegate.Grant
	for _, o := range w.active(g.Node) {
		if o.ID != g.ID && o.HostNQN == g.HostNQN && o.Scope() == g.Scope() && !skip(o) {
			out = append(out, o)
		}
	}
	return out
}

func ids(gs []*nvmegate.Grant) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.ID)
	}
	return out
}

// step does one random operation and returns the host entries it changed
// (nil: a change of no host entry, or none at all).
func (w *world) step() (string, []targetagent.HostRef) {
	ctx := w.ctx
	var all []*nvmegate.Grant
	for _, n := range w.nodes {
		all = append(all, w.active(n)...)
	}
	switch op := w.rng.IntN(10); {
	case op < 4 || len(all) == 0: // connect
		node := w.nodes[w.rng.IntN(len(w.nodes))]
		sub := w.subs[w.rng.IntN(len(w.subs))]
		job := fmt.Sprint("job-", w.rng.IntN(2))
		w.n++
		g := &nvmegate.Grant{ID: fmt.Sprintf("grant-%06d", w.n), JobID: job, Tenant: "acme", Node: node, HostNQN: w.hostOf[node], SubsystemNQN: sub,
			KeyScope: w.scope(sub), IssuedAt: w.clk.now, ExpiresAt: w.clk.now.Add(time.Duration(10+w.rng.IntN(50)) * time.Minute), State: nvmegate.GrantActive}
		w.entry(g)
		changed := []*nvmegate.Grant{g}
		for _, o := range w.active(node) {
			if o.JobID == job && o.SubsystemNQN == sub {
				o.State = nvmegate.GrantReleased
				changed = append(changed, o)
			}
		}
		moving := w.sharing(g, func(o *nvmegate.Grant) bool { return o.JobID == job && o.SubsystemNQN == sub })
		if err := w.db.PutGrantsMoving(ctx, changed, ids(moving), nil, store.EntryOf(g)); err != nil {
			w.t.Fatal(err)
		}
		return "connect " + g.ID, targetagent.HostsOf(append(changed, moving...)...)
	case op < 6: // release
		g := all[w.rng.IntN(len(all))]
		g.State = nvmegate.GrantReleased
		if err := w.db.PutGrant(ctx, g); err != nil {
			w.t.Fatal(err)
		}
		return "release " + g.ID, targetagent.HostsOf(g)
	case op < 8: // renew, with new obligations
		g := all[w.rng.IntN(len(all))]
		w.entry(g)
		g.ExpiresAt = w.clk.now.Add(time.Hour)
		moving := w.sharing(g, func(*nvmegate.Grant) bool { return false })
		if err := w.db.PutGrantsMoving(ctx, []*nvmegate.Grant{g}, ids(moving), nil, store.EntryOf(g)); err != nil {
			w.t.Fatal(err)
		}
		return "renew " + g.ID, targetagent.HostsOf(append([]*nvmegate.Grant{g}, moving...)...)
	case op == 8: // a root rotates: nothing changes until renewals
		if _, err := w.km.Rotate(ctx, w.scope(w.subs[w.rng.IntN(len(w.subs))]), "test"); err != nil {
			w.t.Fatal(err)
		}
		return "rotate", nil
	default: // time passes; the sweeper ends what expired
		w.clk.now = w.clk.now.Add(time.Duration(5+w.rng.IntN(20)) * time.Minute)
		w.km.Tick(ctx)
		gs, err := w.db.ExpiredGrants(ctx)
		if err != nil {
			w.t.Fatal(err)
		}
		for _, g := range gs {
			g.State = nvmegate.GrantExpired
		}
		if len(gs) > 0 {
			if err := w.db.PutGrants(ctx, gs...); err != nil {
				w.t.Fatal(err)
			}
		}
		return fmt.Sprintf("sweep %d", len(gs)), targetagent.HostsOf(gs...)
	}
}

// counting counts a driver's whole and delta applications.
type counting struct {
	targetagent.Driver
	whole, deltas atomic.Int32
}

func (c *counting) Apply(ctx context.Context, s fabric.State) error {
	c.whole.Add(1)
	return c.Driver.Apply(ctx, s)
}

func (c *counting) ApplyDelta(ctx context.Context, d fabric.Delta) error {
	c.deltas.Add(1)
	return c.Driver.ApplyDelta(ctx, d)
}

// Property: after random grant changes — connects superseding and moving
// grants, releases, renewals with new obligations, rotations, expiries;
// several nodes holding one host NQN (a binding that moved), TLS grants —
// each programmed as a delta of the host entries it changed, the target
// holds exactly the state Agent.State builds whole from the store.
func TestProgramDeltasEquivalence(t *testing.T) {
	subs := []string{sub, sub + "-2", sub + "-3"}
	nodes := []string{"spiffe://x/node/a", "spiffe://x/node/b", "spiffe://x/node/c", "spiffe://x/node/d"}
	hostOf := map[string]string{nodes[0]: hostA, nodes[1]: "nqn.2014-08.org.nvmexpress:uuid:00000003-aaaa-4000-8000-000000000000",
		nodes[2]: hostB, nodes[3]: "nqn.2014-08.org.example:host[1]*"}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			w := newWorld(t, seed, nvmegate.DriverSPDK, subs, nodes, hostOf)
			rec := &counting{Driver: &recorder{}}
			a := &targetagent.Agent{Store: w.db, Keys: w.km, Now: w.clk.Now, Driver: func(*nvmegate.Target) targetagent.Driver { return rec }}
			if err := a.Reconcile(w.ctx); err != nil {
				t.Fatal(err)
			}
			for i := range 150 {
				what, refs := w.step()
				if len(refs) > 0 {
					if err := a.Program(w.ctx, "t1", refs...); err != nil {
						t.Fatalf("step %d (%s): %v", i, what, err)
					}
				}
				want, err := a.State(w.ctx, w.target)
				if err != nil {
					t.Fatal(err)
				}
				got := *rec.Driver.(*recorder).last.Load()
				if !reflect.DeepEqual(canonical(got), canonical(want)) {
					t.Fatalf("step %d (%s): the target holds\n%+v\nthe store's state is\n%+v", i, what, got, want)
				}
			}
			if rec.whole.Load() != 1 || rec.deltas.Load() < 50 {
				t.Fatalf("%d whole states and %d deltas applied; want 1 whole state, then deltas", rec.whole.Load(), rec.deltas.Load())
			}
		})
	}
}

// canonical is s without its generation, with no empty host lists.
func canonical(s fabric.State) fabric.State {
	s.Generation = 0
	s.Subsystems = slices.Clone(s.Subsystems)
	for i := range s.Subsystems {
		if len(s.Subsystems[i].Hosts) == 0 {
			s.Subsystems[i].Hosts = nil
		}
	}
	return s
}

// dump renders a tree (nvmettest.Dump).
func dump(t testing.TB, root string) string { t.Helper(); return nvmettest.Dump(t, root) }

// hubServer is the gateway's TargetAgent service reduced to its stream:
// one target's updates from the hub, acknowledgements to it.
type hubServer struct {
	pb.UnimplementedTargetAgentServer
	id    string
	hub   *targetagent.Hub
	agent *targetagent.Agent
}

func (s *hubServer) Watch(r *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	sub, err := s.hub.Subscribe(s.id, r.AcceptDeltas)
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	defer sub.Close()
	go s.agent.Program(stream.Context(), s.id)
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case <-sub.Ended():
			return status.Error(codes.Unavailable, sub.Err().Error())
		case u := <-sub.Updates():
			m := targetagent.UpdateToProto(s.id, u)
			m.StreamId = sub.ID()
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
}

func (s *hubServer) Ack(_ context.Context, r *pb.AckRequest) (*pb.AckResponse, error) {
	if err := s.hub.Ack(s.id, r.StreamId, r.Generation, r.Error); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return &pb.AckResponse{}, nil
}

// serve runs srv on a loopback gRPC server and returns a connection to it.
func serve(t testing.TB, srv pb.TargetAgentServer) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterTargetAgentServer(s, srv)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// runRemote runs a remote agent on conn with driver d until the test ends.
func runRemote(t testing.TB, conn grpc.ClientConnInterface, d targetagent.Driver, applied func(uint64, error)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { (&targetagent.Remote{Conn: conn, Driver: d, Applied: applied}).Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// Property, on nvmet trees: random grant changes programmed as deltas —
// through the local driver, and through a remote agent over gRPC — leave
// the target's tree exactly as a whole Apply of the store's state makes
// it on an empty one.
func TestProgramDeltasNVMetTree(t *testing.T) {
	subs := []string{sub, sub + "-2"}
	nodes := []string{"spiffe://x/node/a", "spiffe://x/node/b", "spiffe://x/node/c"}
	hostOf := map[string]string{nodes[0]: hostA, nodes[1]: hostB, nodes[2]: "nqn.2014-08.org.example:host[1]*"}
	for _, remote := range []bool{false, true} {
		t.Run(fmt.Sprint("remote=", remote), func(t *testing.T) {
			w := newWorld(t, 1, nvmegate.DriverNVMet, subs, nodes, hostOf)
			root, scratch := filepath.Join(t.TempDir(), "nvmet"), t.TempDir()
			d := &counting{Driver: &nvmet.Driver{Root: root}}
			a := &targetagent.Agent{Store: w.db, Keys: w.km, Now: w.clk.Now}
			if remote {
				a.Hub = &targetagent.Hub{}
				applied := make(chan uint64, 1)
				runRemote(t, serve(t, &hubServer{id: "t1", hub: a.Hub, agent: a}), d, func(gen uint64, err error) {
					if err == nil {
						select {
						case applied <- gen:
						default:
						}
					}
				})
				select {
				case <-applied:
				case <-time.After(10 * time.Second):
					t.Fatal("the remote agent applied nothing")
				}
			} else {
				a.Driver = func(*nvmegate.Target) targetagent.Driver { return d }
				if err := a.Reconcile(w.ctx); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 40 {
				what, refs := w.step()
				if len(refs) > 0 {
					if err := a.Program(w.ctx, "t1", refs...); err != nil {
						t.Fatalf("step %d (%s): %v", i, what, err)
					}
				}
				st, err := a.State(w.ctx, w.target)
				if err != nil {
					t.Fatal(err)
				}
				want := filepath.Join(scratch, "nvmet")
				os.RemoveAll(want)
				if err := (&nvmet.Driver{Root: want}).Apply(w.ctx, st); err != nil {
					t.Fatal(err)
				}
				if got, want := dump(t, root), dump(t, want); got != want {
					t.Fatalf("step %d (%s): the tree differs from a whole Apply of the store's state:\n--- target\n%s--- whole\n%s", i, what, got, want)
				}
			}
			if d.whole.Load() != 1 || d.deltas.Load() < 10 {
				t.Fatalf("%d whole states and %d deltas applied; want 1 whole state, then deltas", d.whole.Load(), d.deltas.Load())
			}
		})
	}
}

// scripted is a gateway that sends each Watch its scripted updates and
// records what the agent sends back.
type scripted struct {
	pb.UnimplementedTargetAgentServer
	mu      sync.Mutex
	watches []*pb.WatchRequest
	script  [][]*pb.WatchResponse // per Watch, in order
	acks    chan *pb.AckRequest
}

func (s *scripted) Watch(r *pb.WatchRequest, stream grpc.ServerStreamingServer[pb.WatchResponse]) error {
	s.mu.Lock()
	n := len(s.watches)
	s.watches = append(s.watches, r)
	s.mu.Unlock()
	if n < len(s.script) {
		for _, m := range s.script[n] {
			if err := stream.Send(m); err != nil {
				return err
			}
		}
	}
	<-stream.Context().Done()
	return nil
}

func (s *scripted) Ack(_ context.Context, r *pb.AckRequest) (*pb.AckResponse, error) {
	s.acks <- r
	return &pb.AckResponse{}, nil
}

// A remote agent applies a whole state and the deltas on top of it, in
// order; a delta from another base is refused (acknowledged as an error,
// nothing applied), the agent reconnects, and the whole state the new
// stream starts with leaves the tree a whole Apply of it makes.
func TestRemoteRefusesStaleDelta(t *testing.T) {
	h := func(nqn, key string) fabric.Host {
		return fabric.Host{NQN: nqn, DHCHAPKey: key, DHCHAPHash: fabric.Hash("sha256"), DHCHAPGroup: "null"}
	}
	hostC := "nqn.2014-08.org.example:host[1]*"
	a, b, c := h(hostA, "DHHC-1:00:a:"), h(hostB, "DHHC-1:00:b:"), h(hostC, "DHHC-1:00:c:")
	whole := func(gen uint64, hosts ...fabric.Host) fabric.State {
		return fabric.State{Generation: gen, Subsystems: []fabric.Subsystem{{NQN: sub, Hosts: hosts,
			Ports: []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "10.0.0.1", Trsvcid: "4420", Treq: "not required", Tsas: "none"}}}}}
	}
	delta := func(base, gen uint64, hosts ...fabric.Host) *pb.WatchResponse {
		d := &fabric.Delta{Base: base, Generation: gen}
		for _, x := range hosts {
			d.Hosts = append(d.Hosts, fabric.HostChange{Subsystem: sub, Host: x})
		}
		return targetagent.UpdateToProto("t1", targetagent.Update{Delta: d})
	}
	final := whole(9, a, c)
	srv := &scripted{acks: make(chan *pb.AckRequest, 10), script: [][]*pb.WatchResponse{
		{targetagent.StateToProto("t1", whole(1, a)), delta(1, 2, b), delta(7, 8, c)},
		{targetagent.StateToProto("t1", final)},
	}}
	root := t.TempDir()
	runRemote(t, serve(t, srv), &nvmet.Driver{Root: root}, nil)
	for _, want := range []struct {
		gen uint64
		err string
	}{{1, ""}, {2, ""}, {8, "reconnecting for the whole state"}, {9, ""}} {
		select {
		case ack := <-srv.acks:
			if ack.Generation != want.gen || !strings.Contains(ack.Error, want.err) || (want.err == "") != (ack.Error == "") {
				t.Fatalf("ack %d %q, want %d %q", ack.Generation, ack.Error, want.gen, want.err)
			}
			if want.gen == 2 {
				if _, err := os.Lstat(filepath.Join(root, "subsystems", sub, "allowed_hosts", hostB)); err != nil {
					t.Fatalf("the delta on top of generation 1 was not applied: %v", err)
				}
			}
			if want.gen == 8 {
				if _, err := os.Lstat(filepath.Join(root, "hosts", hostC)); !os.IsNotExist(err) {
					t.Fatalf("the stale delta was applied: %v", err)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no ack for generation %d", want.gen)
		}
	}
	srv.mu.Lock()
	if len(srv.watches) != 2 || !srv.watches[0].AcceptDeltas || !srv.watches[1].AcceptDeltas {
		t.Fatalf("watches %v, want two that accept deltas", srv.watches)
	}
	srv.mu.Unlock()
	want := t.TempDir()
	if err := (&nvmet.Driver{Root: want}).Apply(context.Background(), final); err != nil {
		t.Fatal(err)
	}
	if dump(t, root) != dump(t, want) {
		t.Fatalf("after recovery:\n%s\nwant\n%s", dump(t, root), dump(t, want))
	}
}

// An agent from before deltas gets every change as a whole state; an
// agent that reconnects gets the whole state first; a change after an
// inventory change, or on a subsystem the state does not have, is sent as
// the whole state rebuilt from the store.
func TestWholeStates(t *testing.T) {
	subs := []string{sub, sub + "-2"}
	nodes := []string{"spiffe://x/node/a", "spiffe://x/node/b"}
	w := newWorld(t, 3, nvmegate.DriverSPDK, subs, nodes, map[string]string{nodes[0]: hostA, nodes[1]: hostB})
	hub := &targetagent.Hub{AckTimeout: 5 * time.Second}
	a := &targetagent.Agent{Store: w.db, Keys: w.km, Now: w.clk.Now, Hub: hub}
	// subscribe plays a stream: it acknowledges every update and tells
	// what kind each was.
	subscribe := func(deltas bool) (<-chan string, func()) {
		sb, err := hub.Subscribe("t1", deltas)
		if err != nil {
			t.Fatal(err)
		}
		kinds, stop := make(chan string, 100), make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case u := <-sb.Updates():
					kind := "whole"
					if u.Delta != nil {
						kind = "delta"
					}
					kinds <- kind
					hub.Ack("t1", sb.ID(), u.Generation(), "")
				}
			}
		}()
		return kinds, func() { sb.Close(); close(stop) }
	}
	expect := func(kinds <-chan string, want ...string) {
		t.Helper()
		for _, k := range want {
			select {
			case got := <-kinds:
				if got != k {
					t.Fatalf("a %s update, want %s", got, k)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no update, want %s", k)
			}
		}
		select {
		case got := <-kinds:
			t.Fatalf("an unexpected %s update", got)
		default:
		}
	}
	// connect adds a new host: a change every time.
	n := 0
	connect := func(s string) {
		t.Helper()
		n++
		g := &nvmegate.Grant{ID: fmt.Sprintf("grant-w%05d", n), JobID: "j", Tenant: "acme", Node: nodes[n%2],
			HostNQN: fmt.Sprintf("nqn.2014-08.org.example:host-%d", n), SubsystemNQN: s, KeyScope: w.scope(s), KeyVersion: 1,
			IssuedAt: w.clk.now, ExpiresAt: w.clk.now.Add(time.Hour), State: nvmegate.GrantActive, DHCHAPHash: "sha256", DHGroup: "null"}
		if err := w.db.PutGrant(w.ctx, g); err != nil {
			t.Fatal(err)
		}
		if err := a.Program(w.ctx, "t1", targetagent.HostOf(g)); err != nil {
			t.Fatal(err)
		}
	}
	old, cancel := subscribe(false)
	connect(sub)
	connect(sub)
	expect(old, "whole", "whole")
	cancel()

	kinds, cancel := subscribe(true)
	defer cancel()
	connect(sub)
	connect(sub + "-2")
	expect(kinds, "whole", "delta")
	a.InventoryChanged("t1")
	connect(sub)
	expect(kinds, "whole")
	// A subsystem the agent has not heard of: the state is rebuilt.
	if err := w.db.CreateSubsystem(w.ctx, &nvmegate.Subsystem{NQN: sub + "-new", TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.km.Rotate(w.ctx, sub+"-new", "test"); err != nil {
		t.Fatal(err)
	}
	connect(sub + "-new")
	connect(sub + "-new")
	expect(kinds, "whole", "delta")
	st, err := a.State(w.ctx, w.target)
	if err != nil || len(st.Subsystems) != 3 {
		t.Fatalf("state %v %v", st, err)
	}
}

// Concurrent changes, coalesced into fewer runs whose deltas carry all
// their host entries: every Program returns once its host is on the
// target, and the tree ends as a whole Apply of the store's state makes
// it.
func TestProgramConcurrentDeltas(t *testing.T) {
	const n = 40
	var nodes []string
	hostOf := map[string]string{}
	for i := range n {
		nodes = append(nodes, fmt.Sprintf("spiffe://x/node/%d", i))
		hostOf[nodes[i]] = fmt.Sprintf("nqn.2014-08.org.example:host-%d", i)
	}
	w := newWorld(t, 1, nvmegate.DriverNVMet, []string{sub}, nodes, hostOf)
	root := filepath.Join(t.TempDir(), "nvmet")
	d := &counting{Driver: &nvmet.Driver{Root: root}}
	a := &targetagent.Agent{Store: w.db, Keys: w.km, Now: w.clk.Now, Driver: func(*nvmegate.Target) targetagent.Driver { return d }}
	if err := a.Reconcile(w.ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() {
			g := &nvmegate.Grant{ID: fmt.Sprintf("grant-c%05d", i), JobID: "j", Tenant: "acme", Node: node, HostNQN: hostOf[node], SubsystemNQN: sub,
				KeyScope: w.scope(sub), KeyVersion: 1, IssuedAt: w.clk.now, ExpiresAt: w.clk.now.Add(time.Hour), State: nvmegate.GrantActive,
				DHCHAPHash: "sha256", DHGroup: "null"}
			if err := w.db.PutGrant(w.ctx, g); err != nil {
				t.Error(err)
				return
			}
			if err := a.Program(w.ctx, "t1", targetagent.HostOf(g)); err != nil {
				t.Error(err)
				return
			}
			if _, err := os.Lstat(filepath.Join(root, "subsystems", sub, "allowed_hosts", g.HostNQN)); err != nil {
				t.Errorf("Program returned before its host was allowed: %v", err)
			}
		})
	}
	wg.Wait()
	st, err := a.State(w.ctx, w.target)
	if err != nil {
		t.Fatal(err)
	}
	want := t.TempDir()
	if err := (&nvmet.Driver{Root: want}).Apply(w.ctx, st); err != nil {
		t.Fatal(err)
	}
	if dump(t, root) != dump(t, want) {
		t.Fatal("the tree differs from a whole Apply of the store's state")
	}
	if d.whole.Load() != 1 || d.deltas.Load() > n {
		t.Fatalf("%d whole states and %d deltas for %d changes", d.whole.Load(), d.deltas.Load(), n)
	}
	t.Logf("%d changes in %d deltas", n, d.deltas.Load())
}
