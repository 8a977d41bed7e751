package lease

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// Release ends g at its node's request: the target stops allowing the
// host. The caller has recorded the release and checked that g is the
// node's own. It returns nil only once g is ended in the store and its
// target acknowledged a state without the host. Otherwise it says which
// step did not happen (EUNAVAILABLE): the grant was not stored as
// released (it is still active; nothing changed), or it was and its
// target has not removed the host yet — the grant stays RemovalPending,
// Settle retries, and so may the caller: a release of a released grant
// whose removal is pending tells its target again. Once begun, a release
// runs to its end even if the caller hangs up.
func (l *Lifecycle) Release(ctx context.Context, g *nvmegate.Grant) error {
	t, err := l.targetOf(ctx, g)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	if g.State == nvmegate.GrantReleased && g.SupersededBy != "" {
		// Superseded by a connect still in flight, whose refusal would
		// put it back: the node's release makes it final first.
		f := *g
		f.SupersededBy = ""
		if err := l.put(ctx, &f); err != nil {
			l.log.ErrorContext(ctx, "release: superseded grant not made final", "grant", g.ID, "err", err)
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "grant %s was not released (the store did not take it); retry", g.ID)
		}
		g.SupersededBy = ""
	}
	if g.State != nvmegate.GrantActive {
		if !g.RemovalPending {
			return nil // ended, and off its target
		}
		followed, err := l.programEnds(ctx, t.ID, []*nvmegate.Grant{g})
		l.settle(ctx, followed)
		if err != nil {
			return removalPending(g, t)
		}
		return nil
	}
	res := l.run(ctx, &change{op: "release", ends: []*nvmegate.Grant{g}, state: nvmegate.GrantReleased, target: t.ID})
	if len(res.done) == 0 {
		l.log.ErrorContext(ctx, "release: grant not ended in the store", "grant", g.ID, "err", res.err)
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "grant %s was not released (the store did not take it); it is still active; retry", g.ID)
	}
	if res.unfollowed != nil {
		l.log.ErrorContext(ctx, "release: target did not remove the host; removal pending", "target", t.ID, "grant", g.ID, "err", res.unfollowed)
		return removalPending(g, t)
	}
	return nil
}

// removalPending is the caller's error for an ended grant whose target has
// not removed its host: caller-safe (target and grant IDs, no cause).
func removalPending(g *nvmegate.Grant, t *nvmegate.Target) error {
	return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "grant %s is %s, but target %s has not acknowledged removing its host yet: removal pending; the gateway retries, and the release may be retried", g.ID, g.State, t.ID)
}

// Settle retries the removals still pending: it tells the target of every
// ended grant whose removal was not acknowledged of its host entry, and
// settles those whose target acknowledged. It returns how many remain
// pending, and why (the daemon runs it on a timer while any are).
func (l *Lifecycle) Settle(ctx context.Context) (int, error) {
	gs, err := l.grants.PendingRemovals(ctx)
	if err != nil || len(gs) == 0 {
		return len(gs), err
	}
	followed, err := l.programEnds(ctx, "", gs)
	l.settle(ctx, followed)
	n := 0
	for _, g := range gs {
		if g.RemovalPending {
			n++
		}
	}
	return n, err
}

// Revoke ends the active grants sel picks, on caller's authority (its
// SPIFFE ID, recorded), saying why: each gets its own revoke entry — its
// job, host and subsystem — before it ends (the call's entry names only
// what was asked, and auditors follow a job's grants); the targets stop
// allowing the hosts; and the roots the hosts knew rotate (what they knew
// stops working after the grace). Ending access is the safe direction, so
// a grant whose entry cannot be written is ended all the same, and a
// revocation once begun runs to its end even if the caller hangs up. It
// returns the IDs of the grants it ended; an error (EUNAVAILABLE) then
// says that a grant, a target or the key store did not follow, which the
// reconciler and the scheduled rotation retry.
func (l *Lifecycle) Revoke(ctx context.Context, sel Selection, caller, why string) ([]string, error) {
	if sel == (Selection{}) {
		// Not every grant by accident (an empty job ID, say).
		return nil, nvmegate.Invalid("selector", "a revocation names a grant, a job or a node")
	}
	var gs []*nvmegate.Grant
	if sel.GrantID != "" {
		g, err := l.grants.Grant(ctx, sel.GrantID)
		if err != nil {
			return nil, err
		}
		// A grant a connect still in flight superseded could come back
		// if that connect is refused: revoking it makes it final.
		if g.State == nvmegate.GrantActive || g.State == nvmegate.GrantReleased && g.SupersededBy != "" {
			gs = append(gs, g)
		}
		return l.revoke(ctx, gs, caller, why)
	}
	return l.revokeActive(ctx, store.GrantFilter{State: nvmegate.GrantActive, JobID: sel.JobID, Node: sel.Node}, nil, caller, why)
}

// revokeActive revokes the active grants f lists (and keep, if set,
// keeps): what is active once the revocation committed. A connect refused
// meanwhile can have put back a grant it superseded, after the selection:
// it looks again, a few times.
func (l *Lifecycle) revokeActive(ctx context.Context, f store.GrantFilter, keep func(*nvmegate.Grant) bool, caller, why string) ([]string, error) {
	var ended []string
	for i := range 3 {
		if i > 0 {
			ctx = context.WithoutCancel(ctx) // begun: runs to its end
		}
		gs, err := store.All(func(p store.Page) ([]*nvmegate.Grant, string, error) { return l.grants.ListGrants(ctx, f, p) })
		if keep != nil {
			gs = slices.DeleteFunc(gs, func(g *nvmegate.Grant) bool { return !keep(g) })
		}
		if err != nil {
			return ended, err
		}
		if len(gs) == 0 {
			break
		}
		done, err := l.revoke(ctx, gs, caller, why)
		ended = append(ended, done...)
		if err != nil {
			return ended, err // the reconciler and the next sweep retry
		}
	}
	return ended, l.settlePending(ctx, f, keep)
}

// settlePending tells the targets again of the grants of f's job or node
// (and keep's) that ended before but whose removal is still pending: a
// revocation retried after one a target did not follow answers success
// only once the hosts are off their targets, not on the word of the
// store's state alone.
func (l *Lifecycle) settlePending(ctx context.Context, f store.GrantFilter, keep func(*nvmegate.Grant) bool) error {
	// The read model's pending set, not a scan of every grant.
	gs, err := l.grants.PendingRemovals(ctx)
	if err != nil {
		return err
	}
	gs = slices.DeleteFunc(gs, func(g *nvmegate.Grant) bool {
		return f.JobID != "" && g.JobID != f.JobID || f.Node != "" && g.Node != f.Node || keep != nil && !keep(g)
	})
	if len(gs) == 0 {
		return nil
	}
	followed, err := l.programEnds(context.WithoutCancel(ctx), "", gs)
	l.settle(context.WithoutCancel(ctx), followed)
	if err != nil {
		l.log.ErrorContext(ctx, "removal still pending", "err", err)
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "%d grant(s) ended before are still on their targets: removal pending; the gateway retries, and the call may be retried", len(gs)-len(followed))
	}
	return nil
}

// revoke ends gs as revoked (Revoke).
func (l *Lifecycle) revoke(ctx context.Context, gs []*nvmegate.Grant, caller, why string) ([]string, error) {
	entries := make([]audit.Entry, len(gs))
	for i, g := range gs {
		entries[i] = endEntry(audit.EventRevoke, g, caller, why, l.now())
	}
	return l.revokeRecorded(ctx, gs, entries, why)
}

// revokeRecorded ends gs as revoked, entries[i] recording gs[i], and
// rotates the roots their hosts knew, saying why.
func (l *Lifecycle) revokeRecorded(ctx context.Context, gs []*nvmegate.Grant, entries []audit.Entry, why string) ([]string, error) {
	ctx = context.WithoutCancel(ctx)
	res := l.run(ctx, &change{op: "revoke", ends: gs, state: nvmegate.GrantRevoked, endEntries: entries, endUnrecorded: true, rotate: why})
	ended := ids(res.done)
	if err := errors.Join(res.err, res.unfollowed); err != nil {
		l.log.ErrorContext(ctx, "revocation incomplete; the reconciler and the scheduled rotation retry", "err", err)
		return ended, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "revoked %d grant(s), but a target or a key store did not follow; it is retried", len(ended))
	}
	return ended, nil
}

// EndNodes revokes the active grants of job jobID held by nodes (nodes
// that left the job), on caller's authority, saying why: as Revoke by
// job, keeping those of nodes. A grant of one of them decided before it
// left is refused in its commit (store.OpenGrant), so none comes after.
func (l *Lifecycle) EndNodes(ctx context.Context, jobID string, nodes []string, caller, why string) ([]string, error) {
	if jobID == "" || len(nodes) == 0 {
		return nil, nil
	}
	leaving := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		leaving[n] = true
	}
	return l.revokeActive(ctx, store.GrantFilter{State: nvmegate.GrantActive, JobID: jobID},
		func(g *nvmegate.Grant) bool { return leaving[g.Node] }, caller, why)
}

// EndJob revokes a finished job's active grants (Revoke), on caller's
// authority, saying why.
func (l *Lifecycle) EndJob(ctx context.Context, jobID, caller, why string) ([]string, error) {
	return l.Revoke(ctx, Selection{JobID: jobID}, caller, why)
}

// Expire ends the grants past their expiry: each is recorded (expire)
// before it is stored as expired, and the targets are told (they would
// drop the hosts at their next reconcile anyway; this makes it a fact in
// the store and the log). A grant whose entry cannot be written is not
// ended: the next sweep retries it. It returns how many it ended; an
// error says which were not recorded or stored. A target that does not
// follow is logged: the reconciler retries.
func (l *Lifecycle) Expire(ctx context.Context) (int, error) {
	all, err := l.grants.ExpiredGrants(ctx)
	if err != nil || len(all) == 0 {
		return 0, err
	}
	// A grant past its renewal deadline but not its expiry did not renew
	// after a change tightened its obligations: it is revoked, naming the
	// change.
	now := l.now()
	var gs, due []*nvmegate.Grant
	var dueEntries []audit.Entry
	for _, g := range all {
		if now.Before(g.ExpiresAt) && !g.ReauthBy.IsZero() {
			due = append(due, g)
			dueEntries = append(dueEntries, endEntry(audit.EventRevoke, g, "", clip("not renewed by "+g.ReauthBy.UTC().Format(time.RFC3339)+
				" after obligations tightened by "+g.ReauthWhy), now))
			continue
		}
		gs = append(gs, g)
	}
	n := 0
	var errs []error
	if len(due) > 0 {
		done, err := l.revokeRecorded(ctx, due, dueEntries, "not renewed after obligations tightened")
		n += len(done)
		errs = append(errs, err)
	}
	if len(gs) == 0 {
		return n, errors.Join(errs...)
	}
	entries := make([]audit.Entry, len(gs))
	for i, g := range gs {
		entries[i] = endEntry(audit.EventExpire, g, "", "grant expired", l.now())
	}
	res := l.run(ctx, &change{op: "expire", ends: gs, state: nvmegate.GrantExpired, endEntries: entries})
	if res.unfollowed != nil {
		l.log.WarnContext(ctx, "target not reprogrammed after expiry; the reconciler retries", "err", res.unfollowed)
	}
	return n + len(res.done), errors.Join(append(errs, res.err)...)
}

// Rebind prepares host NQN nqn for identity node (an admin binding it):
// credentials derive from (host NQN, key scope, root version), so an
// identity that held grants on nqn — released or expired, not revoked —
// still knows the secret its next holder would be given under the same
// root. Every key scope where another identity held nqn at the current
// root version rotates first; what that identity knew stops working after
// the grace, and node's grants derive from the new root. An error
// (EUNAVAILABLE: a root did not rotate) means the binding must not be
// made. The store refuses the binding itself while another identity's
// grant on nqn is active.
func (l *Lifecycle) Rebind(ctx context.Context, nqn, node string) error {
	held, err := l.grants.HostKeyScopes(ctx, nqn)
	if err != nil {
		return err
	}
	// A holder still active refuses the binding (the store checks it
	// again in the binding's commit): all are checked before anything
	// rotates, so that a refusal changes nothing.
	checked := map[string]bool{node: true}
	for _, h := range held {
		if checked[h.Node] {
			continue
		}
		checked[h.Node] = true
		active, err := l.grants.NodeActiveGrants(ctx, h.Node)
		if err != nil {
			return err
		}
		for _, g := range active {
			if nvmegate.CanonicalNQN(g.HostNQN) == nvmegate.CanonicalNQN(nqn) {
				return nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is in use by active grant %s of another identity; revoke them first", nqn, g.ID)
			}
		}
	}
	rotated := map[string]bool{}
	for _, h := range held {
		if h.Node == node || rotated[h.Scope] {
			continue
		}
		st, err := l.keys.Status(ctx, h.Scope)
		if err != nil {
			l.log.ErrorContext(ctx, "rebind: key scope status unavailable; not bound", "scope", h.Scope, "err", err)
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "host NQN %s: the key store did not answer for %s; not bound, retry", nqn, h.Scope)
		}
		if h.Version < st.Current {
			continue // rotated since: what that identity knew is another root's
		}
		if err := l.keys.Revoked(ctx, h.Scope, "host NQN "+nqn+" rebound to "+node); err != nil {
			l.log.ErrorContext(ctx, "rebind: root not rotated; not bound", "scope", h.Scope, "err", err)
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "host NQN %s: the root of %s, which its earlier holder knew, did not rotate; not bound, retry", nqn, h.Scope)
		}
		rotated[h.Scope] = true
	}
	return nil
}
