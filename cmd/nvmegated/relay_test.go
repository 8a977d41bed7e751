package main

import (
	"maps"
	"slices"
	"testing"
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
