package fabric_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/fabric"
)

// A delta applied to a state adds, changes and removes host entries of
// one subsystem each, keeps the hosts sorted, leaves the state it was
// copied from alone, and is refused (ErrNeedFull) on another generation or
// for a subsystem the state does not have.
func TestStateApplyDelta(t *testing.T) {
	a := fabric.Host{NQN: "nqn.2014-08.org.example:a", DHCHAPKey: "k1"}
	b := fabric.Host{NQN: "nqn.2014-08.org.example:b", DHCHAPKey: "k2"}
	base := fabric.State{Generation: 3, Subsystems: []fabric.Subsystem{{NQN: "s1", Hosts: []fabric.Host{b}}, {NQN: "s2"}}}
	st := base
	a2 := a
	a2.DHCHAPKey = "k3"
	d := fabric.Delta{Base: 3, Generation: 4, Hosts: []fabric.HostChange{
		{Subsystem: "s1", Host: a}, {Subsystem: "s2", Host: a}, {Subsystem: "s1", Host: a2}, {Subsystem: "s1", Host: fabric.Host{NQN: b.NQN}, Remove: true},
	}}
	if err := st.ApplyDelta(d); err != nil {
		t.Fatal(err)
	}
	want := fabric.State{Generation: 4, Subsystems: []fabric.Subsystem{{NQN: "s1", Hosts: []fabric.Host{a2}}, {NQN: "s2", Hosts: []fabric.Host{a}}}}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("got %+v, want %+v", st, want)
	}
	if len(base.Subsystems[0].Hosts) != 1 || base.Subsystems[0].Hosts[0] != b || base.Subsystems[1].Hosts != nil {
		t.Fatalf("the state copied from changed: %+v", base)
	}
	if err := st.ApplyDelta(fabric.Delta{Base: 3, Generation: 5}); !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("stale base: %v", err)
	}
	err := st.ApplyDelta(fabric.Delta{Base: 4, Generation: 5, Hosts: []fabric.HostChange{{Subsystem: "s3", Host: a}}})
	if !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("unknown subsystem: %v", err)
	}
	if c := (fabric.HostChange{Subsystem: "s1", Host: a}); strings.Contains(c.String(), "k1") {
		t.Fatalf("a change prints its secret: %s", c)
	}
}
