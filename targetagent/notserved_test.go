package targetagent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/targetagent"
)

// awayKeys is the key manager with the key store away for some
// namespaces: their data keys fail with keys.ErrUnavailable.
type awayKeys struct {
	*keys.Manager
	away map[string]bool
}

func (k awayKeys) NamespaceKeys(ctx context.Context, namespace, owner string) (keys.NamespaceKeys, error) {
	if k.away[namespace] {
		return keys.NamespaceKeys{}, fmt.Errorf("vault: connection refused: %w", keys.ErrUnavailable)
	}
	return k.Manager.NamespaceKeys(ctx, namespace, owner)
}

// partial is a driver that applies a state except the namespaces it names
// (as a target without cryptsetup does), and a namespace of another target.
type partial struct {
	recorder
	refuse []fabric.NotServed
}

func (p *partial) Apply(ctx context.Context, s fabric.State) error {
	p.recorder.Apply(ctx, s)
	if len(p.refuse) == 0 {
		return nil
	}
	return &fabric.NotServedError{Namespaces: p.refuse}
}

// Issue 29, defect 5, the gateway's side: a namespace whose data key cannot
// be had stops nothing else. The key store away (keys.ErrUnavailable): the
// namespace is held — in the state without a key, so the target keeps it
// as it is, neither opened anew nor taken down. Another record's key
// (keys.ErrForeign): left out of the state, so the target takes it down,
// and reported. The other namespaces keep their keys and the host its
// entry; the driver's own report (a namespace it cannot serve) is counted
// too, a generation with one is answered, and a report on a namespace the
// state does not have is not kept.
func TestNamespaceKeysNotHadStopNothing(t *testing.T) {
	ctx := context.Background()
	db, ks, km, _ := oneTarget(t, keys.Options{})
	if _, err := km.Rotate(ctx, sub, "test"); err != nil {
		t.Fatal(err)
	}
	for nsid := uint32(1); nsid <= 3; nsid++ {
		if err := db.CreateNamespace(ctx, &nvmegate.Namespace{SubsystemNQN: sub, NSID: nsid, Tenant: "acme", Region: "eu-west", DataClass: "internal",
			Dataset: nvmegate.Dataset{Name: "d", Digest: "sha256:" + strings.Repeat("0", 64)}, BackingDevice: fmt.Sprintf("/dev/loop%d", nsid)}); err != nil {
			t.Fatal(err)
		}
	}
	name := func(nsid uint32) string { return nvmegate.NamespaceKey{SubsystemNQN: sub, NSID: nsid}.KeyName() }
	// 2: a key left by an earlier record of the name.
	if _, err := ks.CreateDataKey(ctx, name(2), "an-earlier-record"); err != nil {
		t.Fatal(err)
	}
	g := &nvmegate.Grant{ID: "grant-aaaa", JobID: "j", Tenant: "acme", Node: "spiffe://x/node/a", HostNQN: hostA, SubsystemNQN: sub,
		KeyVersion: 1, IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), State: nvmegate.GrantActive, DHCHAPHash: "sha256", DHGroup: "null"}
	if err := db.PutGrant(ctx, g); err != nil {
		t.Fatal(err)
	}

	d := &partial{}
	a := &targetagent.Agent{Store: db, Keys: awayKeys{km, map[string]bool{name(3): true}}, Driver: func(*nvmegate.Target) targetagent.Driver { return d }}
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatalf("Program: %v", err)
	}
	st := d.last.Load()
	nss := st.Subsystems[0].Namespaces
	if len(nss) != 2 || nss[0].NSID != 1 || len(nss[0].DataKey) == 0 || nss[1].NSID != 3 || !nss[1].Held() || len(st.Subsystems[0].Hosts) != 1 {
		t.Fatalf("state: %v hosts %v (want 1 keyed, 2 left out, 3 held; the host)", nss, st.Subsystems[0].Hosts)
	}
	ns := a.NotServed()["t1"]
	if len(ns) != 1 || ns[0].NSID != 2 || !strings.Contains(ns[0].Reason, "another namespace record") {
		t.Fatalf("not served: %v", ns)
	}
	if a.NotServedCount() != 1 {
		t.Fatalf("count %d", a.NotServedCount())
	}

	// The driver cannot serve namespace 1: the generation is still
	// answered, and 1 is reported beside 2; a report on a namespace of no
	// subsystem of the state is not kept.
	d.refuse = []fabric.NotServed{{Subsystem: sub, NSID: 1, Reason: "no dm-crypt"}, {Subsystem: "nqn.2026-01.io.example:elsewhere", NSID: 9, Reason: "x"}}
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatalf("Program with a namespace the target cannot serve: %v", err)
	}
	ns = a.NotServed()["t1"]
	if len(ns) != 2 || ns[0].NSID != 1 || ns[1].NSID != 2 {
		t.Fatalf("not served: %v", ns)
	}
	// A namespace the target could not take down is a removal not done:
	// the generation is not answered as applied.
	d.refuse = []fabric.NotServed{{Subsystem: sub, NSID: 1, Reason: "not taken down", Exported: true}}
	if err := a.Program(ctx, "t1"); err == nil || !strings.Contains(err.Error(), "still exported") {
		t.Fatalf("Program with a namespace still exported: %v", err)
	}
	d.refuse = []fabric.NotServed{{Subsystem: sub, NSID: 1, Reason: "no dm-crypt"}}
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	// Deltas go on top: a change of the host is answered.
	if err := db.PutGrant(ctx, &nvmegate.Grant{ID: "grant-aaaa", JobID: "j", Tenant: "acme", Node: "spiffe://x/node/a", HostNQN: hostA, SubsystemNQN: sub,
		KeyVersion: 1, IssuedAt: g.IssuedAt, ExpiresAt: g.ExpiresAt, State: nvmegate.GrantReleased, DHCHAPHash: "sha256", DHGroup: "null"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Program(ctx, "t1", targetagent.HostOf(g)); err != nil {
		t.Fatalf("a release after a partial state: %v", err)
	}
	if st := d.last.Load(); len(st.Subsystems[0].Hosts) != 0 {
		t.Fatalf("released host still in the state: %v", st.Subsystems[0].Hosts)
	}
	// Everything served again: the report is cleared.
	d.refuse = nil
	a.Keys = km
	if err := ks.DestroyDataKey(ctx, name(2)); err != nil {
		t.Fatal(err)
	}
	if err := a.Program(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if len(a.NotServed()) != 0 {
		t.Fatalf("not served after every key came back: %v", a.NotServed())
	}
}
