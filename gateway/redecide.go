package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/lease"
)

// Change is what a re-decision of the active grants follows: a policy
// revision (All) or changed records, by key. Cause names it in every
// entry the re-decision writes and in its log line.
type Change struct {
	Cause string
	// All: every active grant (a new policy revision can change any
	// decision).
	All bool
	// The records that changed: a grant is affected by its subsystem
	// (and the namespaces on it), the subsystem's target, its node's
	// binding and its job.
	Targets, Subsystems, Nodes, Jobs []string
}

func (c Change) affects(g *nvmegate.Grant, sub *nvmegate.Subsystem) bool {
	return c.All || slices.Contains(c.Subsystems, g.SubsystemNQN) || slices.Contains(c.Nodes, g.Node) ||
		slices.Contains(c.Jobs, g.JobID) || sub == nil || slices.Contains(c.Targets, sub.TargetID)
}

// Redecision is what a re-decision found.
type Redecision struct {
	Checked        int             // active grants the change affects, decided again
	Decided        []lease.Verdict // all of them, allowed ones included
	Ending         []lease.Verdict // no longer allowed (or no longer possible)
	Tightening     []lease.Verdict // allowed, under obligations they were not issued under
	PolicyRevision string          // the revision that decided
	DataRevision   uint64          // the store revision the grants and records were read at (0: it moved)
	// Done, unless a dry run: what lease.Reconsider did with the verdicts.
	Done lease.Reconsidered
}

// opensAccess are the calls that grant access.
var opensAccess = map[string]bool{connectMethod: true, "/nvmegate.v1.Access/Renew": true}

// connectMethod is the call a grant's re-decision is decided as: the
// connect its node would make now.
const connectMethod = "/nvmegate.v1.Access/Connect"

// Redecide decides again, with authorizer a (nil: the gateway's own), the
// active grants change affects, exactly as a connect of each grant's node
// to its subsystem in its job would be decided now, and — unless dryRun —
// has the lifecycle revoke those no longer allowed and require a renewal
// of those under stronger obligations (lease.Lifecycle.Reconsider). It
// first waits for the connects and renewals that began before it was
// called, so that a grant decided under the state before the change is
// among those it decides again. A policy impact (a candidate's authorizer,
// dryRun) changes nothing.
func (s *Server) Redecide(ctx context.Context, change Change, a authz.Authorizer, dryRun bool) (*Redecision, error) {
	if s.lease == nil {
		return &Redecision{}, nil
	}
	if a == nil {
		a = s.authorizer
	}
	if !dryRun {
		// One re-decision acts at a time: two changes landing together
		// must not revoke a grant twice.
		s.redecideMu.Lock()
		defer s.redecideMu.Unlock()
	}
	if err := s.openings.waitEarlier(ctx); err != nil {
		return nil, fmt.Errorf("redecide: waiting for the connects in flight: %w", err)
	}
	var rev uint64
	if s.revisions != nil {
		rev = s.revisions.ScopeRevision()
	}
	all, err := s.lease.ActiveGrants(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	verdicts := make([]*lease.Verdict, len(all))
	// Grants are listed by subsystem: each worker takes a run of them, so
	// that a job's nodes on one subsystem share the sealed scope of their
	// decisions.
	workers := min(runtime.GOMAXPROCS(0), 1+len(all)/256)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		revs     = map[string]bool{}
	)
	chunk := (len(all) + workers - 1) / max(workers, 1)
	for w := range workers {
		lo, hi := w*chunk, min((w+1)*chunk, len(all))
		wg.Go(func() {
			defer func() {
				// A panic (a candidate policy's evaluation, say) is
				// this re-decision's error, not the gateway's end.
				if p := recover(); p != nil {
					mu.Lock()
					firstErr = firstOf(firstErr, fmt.Errorf("redecide: panic: %v", p))
					mu.Unlock()
				}
			}()
			for i := lo; i < hi; i++ {
				v, err := s.redecideOne(ctx, a, all[i], change, now)
				if err != nil {
					mu.Lock()
					firstErr = firstOf(firstErr, err)
					mu.Unlock()
					return
				}
				if v != nil {
					verdicts[i] = v
					if r := v.Decision.PolicyRevision; r != "" {
						mu.Lock()
						revs[r] = true
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	out := &Redecision{}
	if s.revisions != nil && s.revisions.ScopeRevision() == rev {
		out.DataRevision = rev
	}
	for r := range revs {
		out.PolicyRevision = r // one revision decides a re-decision (a reload mid-way is a change of its own)
	}
	var acted []lease.Verdict
	for _, v := range verdicts {
		if v == nil {
			continue
		}
		out.Checked++
		out.Decided = append(out.Decided, *v)
		switch {
		case v.Ends():
			out.Ending = append(out.Ending, *v)
			acted = append(acted, *v)
		case len(v.Shortfalls) > 0:
			out.Tightening = append(out.Tightening, *v)
			acted = append(acted, *v)
		}
	}
	if dryRun || len(acted) == 0 {
		return out, nil
	}
	out.Done, err = s.lease.Reconsider(ctx, acted, change.Cause, rev, s.self)
	s.log.InfoContext(ctx, "grants re-decided", "cause", change.Cause, "checked", out.Checked,
		"revoked", len(out.Done.Revoked), "must_renew", len(out.Done.Marked), "policy_revision", out.PolicyRevision, "data_revision", rev)
	s.metrics.redecided(len(out.Done.Revoked), len(out.Done.Marked))
	return out, err
}

// firstOf keeps the first error.
func firstOf(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// redecideOne decides g again if change affects it; nil if it does not.
// A grant whose records cannot be read or whose decision fails is not
// allowed (fail closed): its verdict ends it, saying why. Only the
// context's end is an error.
func (s *Server) redecideOne(ctx context.Context, a authz.Authorizer, g *nvmegate.Grant, change Change, now time.Time) (*lease.Verdict, error) {
	// A describer of its own per grant: one reads every record at the
	// revision it reports, so a sealed scope it makes is exact.
	d := &describer{ctx: ctx, store: s.store, jobs: s.jobs, members: &s.members, revisions: s.revisions, caller: g.Node}
	sub, err := d.subsystemRec(g.SubsystemNQN)
	if err != nil {
		return unreadable(ctx, g, err)
	}
	if !change.affects(g, sub) {
		return nil, nil
	}
	id, err := spiffeid.FromString(g.Node)
	if err != nil {
		return unreadable(ctx, g, err)
	}
	sc, rev, err := d.subsystemScope(g.JobID, g.SubsystemNQN, g.HostNQN, "")
	if err != nil {
		return unreadable(ctx, g, err)
	}
	var in *authz.Input
	if typedCall(sc) {
		in = authz.NewInput(authz.ParseCaller(id), connectMethod, "", nil)
		if rev != 0 {
			in.Scope = s.scopes.scope(sc, rev)
		} else {
			in.Scope = authzScope(sc)
		}
	} else {
		in = authz.NewInput(authz.ParseCaller(id), connectMethod, "", scopeResource(sc))
	}
	dec, err := a.Authorize(ctx, in)
	if dec == nil && err == nil {
		err = errors.New("the authorizer returned no decision")
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Fail closed: a grant policy cannot decide is not allowed.
		if dec == nil {
			dec = &nvmegate.Decision{}
		}
		dec.Allow, dec.Reasons = false, []string{"policy could not decide: " + nvmegate.WithholdQuoted(err.Error())}
	}
	v := &lease.Verdict{Grant: g, Decision: dec}
	if !dec.Allow {
		return v, nil
	}
	switch {
	case sc.Subsystem == nil || sc.Target == nil:
		v.Refusal = "subsystem " + g.SubsystemNQN + " or its target is no longer in the inventory"
	case nvmegate.CanonicalNQN(sc.Binding.HostNQN) != nvmegate.CanonicalNQN(g.HostNQN):
		v.Refusal = "the node's host binding is no longer " + g.HostNQN
	default:
		short, err := g.Shortfalls(sc.Subsystem, sc.Target, dec.Obligations, now)
		if err != nil {
			v.Refusal = nvmegate.WithholdQuoted(err.Error())
		}
		v.Shortfalls = short
	}
	return v, nil
}

// unreadable is the verdict on a grant whose records or node cannot be
// read: it ends (fail closed), naming why; the context's end is an error.
func unreadable(ctx context.Context, g *nvmegate.Grant, err error) (*lease.Verdict, error) {
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return &lease.Verdict{Grant: g, Decision: &nvmegate.Decision{}, Refusal: "its scope could not be read: " + nvmegate.WithholdQuoted(err.Error())}, nil
}

// openings tracks the connects and renewals in flight, so that a
// re-decision can wait for those that began before the change it follows
// (Server.Redecide): they may have been decided under the state before it.
type openings struct {
	mu       sync.Mutex
	next     uint64
	inflight map[uint64]struct{}
	// changed is made by a waiting re-decision and closed (and dropped)
	// when an opening ends: a connect with no one waiting allocates
	// nothing.
	changed chan struct{}
}

// enter registers a connect or renewal; exit ends it.
func (o *openings) enter() uint64 {
	o.mu.Lock()
	if o.inflight == nil {
		o.inflight = map[uint64]struct{}{}
	}
	seq := o.next
	o.next++
	o.inflight[seq] = struct{}{}
	o.mu.Unlock()
	return seq
}

func (o *openings) exit(seq uint64) {
	o.mu.Lock()
	delete(o.inflight, seq)
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
	o.mu.Unlock()
}

// waitEarlier returns once every opening that entered before the call has
// ended.
func (o *openings) waitEarlier(ctx context.Context) error {
	o.mu.Lock()
	before := o.next
	o.mu.Unlock()
	for {
		o.mu.Lock()
		busy := false
		for seq := range o.inflight {
			if seq < before {
				busy = true
				break
			}
		}
		if !busy {
			o.mu.Unlock()
			return nil
		}
		if o.changed == nil {
			o.changed = make(chan struct{})
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
