package store

import (
	"context"
	"maps"
	"slices"
	"sync"
)

// ScopeChange is what commits changed of the records a decision reads —
// the inventory, host bindings and jobs, not grants — by key: the change
// stream a re-decision of the active grants follows.
type ScopeChange struct {
	Revision   uint64   // the store revision of the last change included
	Targets    []string // target IDs
	Subsystems []string // subsystem NQNs: the subsystem's record, or a namespace on it
	Bindings   []string // SPIFFE IDs whose host binding changed
	Jobs       []string // job IDs
}

// ScopeFeed delivers the scope changes after the moment it was made
// (DB.WatchScope), coalesced: a reader that falls behind gets, at its next
// Next, everything that changed meanwhile in one ScopeChange. A commit
// never waits for a reader.
type ScopeFeed struct {
	mu      sync.Mutex
	pending scopeKeys
	rev     uint64
	notify  chan struct{} // holds a token while something is pending
}

type scopeKeys struct{ targets, subsystems, bindings, jobs map[string]bool }

// WatchScope returns a feed of the scope changes committed from now on.
func (db *DB) WatchScope() *ScopeFeed {
	f := &ScopeFeed{notify: make(chan struct{}, 1)}
	db.model.mu.Lock()
	db.model.feeds = append(db.model.feeds, f)
	db.model.mu.Unlock()
	return f
}

// Next waits for changes and returns them, or ctx's error.
func (f *ScopeFeed) Next(ctx context.Context) (ScopeChange, error) {
	select {
	case <-f.notify:
	case <-ctx.Done():
		return ScopeChange{}, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.pending
	f.pending = scopeKeys{}
	return ScopeChange{Revision: f.rev, Targets: slices.Sorted(maps.Keys(p.targets)), Subsystems: slices.Sorted(maps.Keys(p.subsystems)),
		Bindings: slices.Sorted(maps.Keys(p.bindings)), Jobs: slices.Sorted(maps.Keys(p.jobs))}, nil
}

// add records the scope records of ops, committed at rev.
func (f *ScopeFeed) add(rev uint64, ops []op) {
	f.mu.Lock()
	for _, o := range ops {
		switch {
		case o.target != nil:
			f.pending.targets = put1(f.pending.targets, o.target.ID)
		case o.subsystem != nil:
			f.pending.subsystems = put1(f.pending.subsystems, o.subsystem.NQN)
			// A subsystem moved between targets affects both.
			f.pending.targets = put1(f.pending.targets, o.subsystem.TargetID)
		case o.namespace != nil:
			f.pending.subsystems = put1(f.pending.subsystems, o.namespace.SubsystemNQN)
		case o.binding != nil:
			f.pending.bindings = put1(f.pending.bindings, o.binding.SPIFFEID)
		case o.job != nil:
			f.pending.jobs = put1(f.pending.jobs, o.job.ID)
		}
	}
	f.rev = rev
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default: // a token is waiting already
	}
}

func put1(m map[string]bool, k string) map[string]bool {
	if m == nil {
		m = map[string]bool{}
	}
	m[k] = true
	return m
}
