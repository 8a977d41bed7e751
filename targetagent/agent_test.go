package targetagent_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

const (
	sub   = "nqn.2026-01.io.nvmegate.test:acme-train"
	hostA = "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000"
)

// recorder is a driver that keeps the state it was brought to.
type recorder struct{ last atomic.Pointer[fabric.State] }

func (r *recorder) Apply(_ context.Context, s fabric.State) error { r.last.Store(&s); return nil }

func (r *recorder) ApplyDelta(_ context.Context, d fabric.Delta) error {
	last := r.last.Load()
	if last == nil {
		return fabric.ErrNeedFull
	}
	s := *last
	if err := s.ApplyDelta(d); err != nil {
		return err
	}
	r.last.Store(&s)
	return nil
}

type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// The desired state: every subsystem of the target with its ports; the
// hosts of active, unexpired grants with the credentials of their root
// version; none whose grant ended or expired or whose root passed its
// grace; nothing for targets of other drivers.
func TestState(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	db, err := store.Open(filepath.Join(dir, "s.db"), store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ks, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	km, err := keys.NewManager(keys.Options{Backend: ks, Now: clk.Now, Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tgt := &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverNVMet, Ports: []nvmegate.Port{
		{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"},
		{ID: 2, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4421", SecureChannel: nvmegate.SecureChannelRequired}}}
	spdk := &nvmegate.Target{ID: "t2", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverSPDK, Ports: tgt.Ports}
	for _, x := range []*nvmegate.Target{tgt, spdk} {
		if err := db.CreateTarget(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1, 2}, DHCHAP: true, TLS: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := km.Rotate(ctx, sub, "test"); err != nil {
		t.Fatal(err)
	}
	grant := func(id, host string, v uint64, state string, exp time.Duration) {
		t.Helper()
		g := &nvmegate.Grant{ID: id, JobID: "j", Tenant: "acme", Node: "spiffe://x/node/" + id, HostNQN: host, SubsystemNQN: sub,
			KeyVersion: v, IssuedAt: clk.now, ExpiresAt: clk.now.Add(exp), State: state, DHCHAPHash: "sha384", DHGroup: "ffdhe3072", Bidirectional: true}
		if err := db.PutGrant(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	grant("grant-aaaa", hostA, 1, nvmegate.GrantActive, time.Hour)
	grant("grant-bbbb", hostB, 1, nvmegate.GrantReleased, time.Hour)

	rec := &recorder{}
	a := &targetagent.Agent{Store: db, Keys: km, Now: clk.Now, Driver: func(x *nvmegate.Target) targetagent.Driver {
		if x.Driver != nvmegate.DriverNVMet {
			return nil
		}
		return rec
	}}
	if err := a.Reconcile(ctx); err != nil {
		t.Fatal(err) // t2 (spdk, no driver) is skipped, not an error
	}
	if err := a.Program(ctx, "t2"); !errors.Is(err, targetagent.ErrNotManaged) {
		t.Fatalf("Program of an unmanaged target: %v, want ErrNotManaged", err)
	}
	st := rec.last.Load()
	if st == nil || len(st.Subsystems) != 1 || len(st.Subsystems[0].Hosts) != 1 || len(st.Subsystems[0].Ports) != 2 {
		t.Fatalf("state %+v", st)
	}
	h := st.Subsystems[0].Hosts[0]
	c, err := km.CredentialsAt(ctx, hostA, sub, 1, keys.CredentialParams{DHCHAPHash: 2, Bidirectional: true})
	if err != nil {
		t.Fatal(err)
	}
	if h.NQN != hostA || h.DHCHAPKey != c.HostSecret || h.DHCHAPCtrlKey != c.CtrlSecret || h.DHCHAPHash != "hmac(sha384)" || h.DHCHAPGroup != "ffdhe3072" {
		t.Fatalf("host %v", h)
	}
	if p := st.Subsystems[0].Ports[1]; p.Treq != "required" || p.Tsas != "tls1.3" {
		t.Fatalf("port %+v", p)
	}
	if strings.Contains(h.String(), "DHHC-1") {
		t.Fatal("a host prints its secret")
	}

	// The root rotates; two hours later v1 is past its grace: the host
	// whose grant still names v1 is no longer allowed.
	if _, err := km.Rotate(ctx, sub, "test"); err != nil {
		t.Fatal(err)
	}
	grant("grant-cccc", hostB, 2, nvmegate.GrantActive, 3*time.Hour)
	clk.now = clk.now.Add(2 * time.Hour)
	km.Tick(ctx)
	grant("grant-aaaa", hostA, 1, nvmegate.GrantActive, 3*time.Hour) // extended, but on the old root
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	st = rec.last.Load()
	if hs := st.Subsystems[0].Hosts; len(hs) != 1 || hs[0].NQN != hostB {
		t.Fatalf("after the grace: %v", hs)
	}
	// And an expired grant leaves too.
	clk.now = clk.now.Add(2 * time.Hour)
	km.Tick(ctx)
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if hs := rec.last.Load().Subsystems[0].Hosts; len(hs) != 0 {
		t.Fatalf("after expiry: %v", hs)
	}
}

// gate is a driver whose first application waits for release.
type gate struct {
	calls   atomic.Int32
	release chan struct{}
	last    atomic.Pointer[fabric.State]
}

func (g *gate) Apply(_ context.Context, s fabric.State) error {
	if g.calls.Add(1) == 1 {
		<-g.release
	}
	g.last.Store(&s)
	return nil
}

func (g *gate) ApplyDelta(context.Context, fabric.Delta) error {
	return fabric.ErrNeedFull // whole states only
}

// Program calls made while a run is going are answered together by one
// more run, which sees every grant stored before them.
func TestProgramCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		dir := t.TempDir()
		db, err := store.Open(filepath.Join(dir, "s.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ks, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
		if err != nil {
			t.Fatal(err)
		}
		defer ks.Close()
		km, err := keys.NewManager(keys.Options{Backend: ks})
		if err != nil {
			t.Fatal(err)
		}
		if err := db.CreateTarget(ctx, &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverNVMet,
			Ports: []nvmegate.Port{{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"}}}); err != nil {
			t.Fatal(err)
		}
		if err := db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "t1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := km.Rotate(ctx, sub, "test"); err != nil {
			t.Fatal(err)
		}
		g := &gate{release: make(chan struct{})}
		a := &targetagent.Agent{Store: db, Keys: km, Driver: func(*nvmegate.Target) targetagent.Driver { return g }}
		errs := make(chan error, 4)
		go func() { errs <- a.Program(ctx, "t1") }()
		synctest.Wait() // the first run is inside Apply
		now := time.Now()
		for i, h := range []string{hostA, hostB} {
			if err := db.PutGrant(ctx, &nvmegate.Grant{ID: fmt.Sprintf("grant-%d000", i), JobID: "j", Tenant: "acme", Node: "spiffe://x/node/n",
				HostNQN: h, SubsystemNQN: sub, KeyVersion: 1, IssuedAt: now, ExpiresAt: now.Add(time.Hour), State: nvmegate.GrantActive,
				DHCHAPHash: "sha256", DHGroup: "ffdhe2048"}); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			go func() { errs <- a.Program(ctx, "t1") }()
		}
		synctest.Wait() // all three wait for the next run
		close(g.release)
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if n := g.calls.Load(); n != 2 {
			t.Fatalf("%d applies for 4 Program calls (one running, three waiting), want 2", n)
		}
		if hs := g.last.Load().Subsystems[0].Hosts; len(hs) != 2 {
			t.Fatalf("the coalesced run applied %d hosts, want the 2 stored before the calls", len(hs))
		}
	})
}
