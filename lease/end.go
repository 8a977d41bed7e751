package lease

import (
	"context"
	"errors"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// Release ends g at its node's request: the target stops allowing the
// host. The caller has recorded the release and checked that g is the
// node's own; an error means g's target is unknown and nothing changed.
// Once begun, the release runs to its end even if the caller hangs up; a
// store or target that does not follow is logged (the reconciler and the
// expiry catch up).
func (l *Lifecycle) Release(ctx context.Context, g *nvmegate.Grant) error {
	t, err := l.targetOf(ctx, g)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	res := l.run(ctx, &change{op: "release", ends: []*nvmegate.Grant{g}, state: nvmegate.GrantReleased, target: t.ID})
	if res.err != nil {
		l.log.ErrorContext(ctx, "release: grant not ended in the store", "grant", g.ID, "err", res.err)
	}
	if res.unfollowed != nil {
		l.log.ErrorContext(ctx, "release: target not reprogrammed after a grant ended", "target", t.ID, "err", res.unfollowed)
	}
	return nil
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
		if g.State == nvmegate.GrantActive {
			gs = append(gs, g)
		}
	} else {
		f := store.GrantFilter{State: nvmegate.GrantActive, JobID: sel.JobID, Node: sel.Node}
		var err error
		if gs, err = store.All(func(p store.Page) ([]*nvmegate.Grant, string, error) { return l.grants.ListGrants(ctx, f, p) }); err != nil {
			return nil, err
		}
	}
	ctx = context.WithoutCancel(ctx)
	entries := make([]audit.Entry, len(gs))
	for i, g := range gs {
		entries[i] = endEntry(audit.EventRevoke, g, caller, why, l.now())
	}
	res := l.run(ctx, &change{op: "revoke", ends: gs, state: nvmegate.GrantRevoked, endEntries: entries, endUnrecorded: true, rotate: why})
	ended := ids(res.done)
	if err := errors.Join(res.err, res.unfollowed); err != nil {
		l.log.ErrorContext(ctx, "revocation incomplete; the reconciler and the scheduled rotation retry", "err", err)
		return ended, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "revoked %d grant(s), but a target or a key store did not follow; it is retried", len(ended))
	}
	return ended, nil
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
	gs, err := l.grants.ExpiredGrants(ctx)
	if err != nil || len(gs) == 0 {
		return 0, err
	}
	entries := make([]audit.Entry, len(gs))
	for i, g := range gs {
		entries[i] = endEntry(audit.EventExpire, g, "", "grant expired", l.now())
	}
	res := l.run(ctx, &change{op: "expire", ends: gs, state: nvmegate.GrantExpired, endEntries: entries})
	if res.unfollowed != nil {
		l.log.WarnContext(ctx, "target not reprogrammed after expiry; the reconciler retries", "err", res.unfollowed)
	}
	return len(res.done), res.err
}
