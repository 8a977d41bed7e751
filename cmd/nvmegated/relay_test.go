package main

import (
	"context"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// The relay takes only what changes up to the revision it read touched:
// a change the hook heard of while the copy's revision had not yet moved
// to it waits for the next round, so its target is never marked
// acknowledged at a revision its agent was not sent (issue 29, defect 11).
func TestRelayTakesOnlyChangesUpToTheRevisionRead(t *testing.T) {
	p := &targetPeers{targets: map[string][]uint64{}, subs: map[string][]uint64{}, notify: make(chan struct{}, 1)}
	p.changed(4, []string{"t1"}, []string{"s1"})
	p.changed(5, []string{"t2"}, nil)
	// The copy was read at revision 4: change 5 is heard of, not applied.
	targets, subs, later := p.take(4)
	if got := slices.Sorted(maps.Keys(targets)); !slices.Equal(got, []string{"t1"}) || !subs["s1"] || !later {
		t.Fatalf("take(4) = %v %v later=%v; want t1 and s1, with t2 later", got, subs, later)
	}
	targets, _, later = p.take(5)
	if !targets["t2"] || len(targets) != 1 || later {
		t.Fatalf("take(5) = %v later=%v; want t2 alone", targets, later)
	}
	// A target touched before and after the revision read is taken for
	// the change before it, and stays for the change after it.
	p.changed(6, []string{"t3"}, nil)
	p.changed(8, []string{"t3"}, nil)
	if targets, _, later := p.take(7); !targets["t3"] || !later {
		t.Fatalf("take(7) after changes 6 and 8 of t3 = %v later=%v; want t3, and t3 again later", targets, later)
	}
	if targets, _, later := p.take(7); len(targets) != 0 || !later {
		t.Fatalf("take(7) again = %v later=%v; want nothing but change 8 waiting", targets, later)
	}
	if targets, _, later := p.take(8); !targets["t3"] || later {
		t.Fatalf("take(8) = %v later=%v; want t3, nothing waiting", targets, later)
	}
	// A target whose programming failed is taken again.
	p.retry("t4", 8)
	if targets, _, _ := p.take(8); !targets["t4"] {
		t.Fatalf("take(8) after a failed programming of t4 = %v; want t4", targets)
	}
}

// An agent that has just attached here has acknowledged nothing yet: the
// relay programs it and waits for its acknowledgement before it records
// the target's revision in etcd, so another replica's call is not
// answered on the strength of a state still on the way (found by a
// review of issue 29's fixes).
func TestRelayRecordsANewStreamOnlyOnceAcknowledged(t *testing.T) {
	cl := etcdtest.Start(t, 1).Client(t)
	db, err := store.Open(filepath.Join(t.TempDir(), "store.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tgt := &nvmegate.Target{ID: "t1", Fabric: "f", Region: "eu-west", Driver: nvmegate.DriverNVMet,
		Ports: []nvmegate.Port{{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"}}}
	if err := db.CreateTarget(ctx, tgt); err != nil {
		t.Fatal(err)
	}
	p := newTargetPeers(&replication{client: cl, prefix: "/r/"}, db, 5*time.Second)
	hub := &targetagent.Hub{AckTimeout: time.Minute}
	agent := &targetagent.Agent{Store: db, Hub: hub, Peers: p}
	go p.relay(ctx, agent, hub, func(string, ...any) {})
	recorded := func() bool {
		resp, err := cl.Get(ctx, p.key("t1"))
		return err == nil && len(resp.Kvs) == 1 && appliedRev(resp.Kvs[0].Value) >= db.Revision()
	}

	s, err := agent.Subscribe(tgt, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p.wake() // a round, as another replica's change would start one
	var u targetagent.Update
	select {
	case u = <-s.Updates():
	case <-time.After(20 * time.Second):
		t.Fatal("the relay did not program the new stream")
	}
	if recorded() {
		t.Fatal("the target's revision was recorded before its new stream acknowledged anything")
	}
	if err := hub.Ack("t1", s.ID(), u.Generation(), ""); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the revision recorded once acknowledged", recorded)
}
