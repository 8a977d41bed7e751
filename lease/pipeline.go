package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// change is one step of the lifecycle as run carries it out: what is
// recorded, what is stored, which host entries the targets are told of,
// and what undoes it. A step either opens access — grant is set: issue,
// renew — or ends it — ends is set: release, revoke, expire.
type change struct {
	op string // the step, for log lines: "connect", "renew", "release", "revoke", "expire"

	// Opening access.
	grant *nvmegate.Grant // issued or renewed
	entry audit.Entry     // grant's entry, recorded first; its index becomes grant.AuditIndex
	// opening is grant's entry as the commit completes it with the
	// grants it superseded, as decided there: on a journaled store the
	// entry is made durable in the grant's commit instead of before it.
	opening *store.OpeningEntry
	// check, if set, runs after the record: why the grant may no longer
	// be made (recorded as its failure) and what the caller gets, or "".
	check func() (why string, err error)
	// binding, if set, is the host binding the opening was decided with:
	// the commit refuses the grant if the node's binding is no longer it
	// (removed, changed or added meanwhile).
	binding *store.BindingAt
	// moving are the node's grants on grant's host entry whose entry is
	// not grant's: moved to it in the same commit, put back if the target
	// refuses.
	moving []*nvmegate.Grant
	// supersede: a new grant replaces the node's earlier grants in its
	// job on its subsystem: they end (released) in its commit and come
	// back if the target refuses it; superseded are those the commit
	// ended, as stored.
	supersede  bool
	superseded []*nvmegate.Grant
	// storeFailure is the reason recorded if the commit fails; "" records
	// none (a renewal the store refuses is a grant that ended meanwhile,
	// and its end is on the record).
	storeFailure string
	// undo is grant as it is put back if the target refuses: a renewal's
	// grant as it was. Nil for a new grant, which is ended (revoked).
	undo *nvmegate.Grant
	// deny is the entry of a failure after grant's entry (failed adds the
	// time and the reason).
	deny audit.Entry
	// refused is the reason recorded, and refusal the caller's error, when
	// the target does not take the change.
	refused string
	refusal error

	// Ending access.
	ends  []*nvmegate.Grant
	state string // what they end as: released, revoked, expired
	// endEntries[i] is ends[i]'s entry; none: the caller recorded the step
	// (the gateway's audit interceptor records a release).
	endEntries []audit.Entry
	// endUnrecorded ends a grant whose entry could not be made durable all
	// the same (revoke: ending access is the safe direction, and the
	// call's own entry stands for it); otherwise it stays as it is, and
	// the step reports why (expire: the next sweep retries).
	endUnrecorded bool
	// rotate, if set, rotates the roots the ended grants' hosts knew, for
	// that reason.
	rotate string

	// Both: the target all grants are on, and for an opening the host
	// entries it is told of (none: nothing the target holds changed). An
	// end with no target looks each grant's up and tells it of the ended
	// grants' host entries.
	target string
	hosts  []nvmegate.HostRef
}

// outcome is what run did.
type outcome struct {
	// done are the grants stored: the opened grant, or the grants ended.
	done []*nvmegate.Grant
	// err: why an opening was not made (the caller's answer), or which
	// grants an end could not record or store.
	err error
	// unfollowed: a target or the key store that did not follow an end
	// (Settle and the scheduled rotation retry). The ended grants whose
	// target did not follow stay RemovalPending.
	unfollowed error
}

// run carries out a step of the lifecycle, the one way every step is
// done:
//
//  1. record: the step's entries are durable before anything changes. An
//     opening whose entry fails changes nothing; then check runs.
//  2. store: one commit. An opening stores its grant and moves the
//     grants sharing its host entry; if the commit fails, nothing
//     changed. An end that cannot commit is stored
//     grant by grant, so that one bad grant does not keep the others.
//  3. program: the targets are told of the host entries that changed and
//     answer once they hold them.
//  4. compensate: if the target does not take an opening, the grants that
//     moved are put back, the grant is undone (a renewal's old keys) or
//     ended (a new grant), the target follows the store back, and the
//     failure is recorded. An end is never undone: its grants are stored
//     RemovalPending, settled once their target acknowledged the removal;
//     those of a target that did not follow stay pending, for Settle to
//     retry and the caller to be told. An end with rotate has rotated the
//     roots the hosts knew before it was stored.
func (l *Lifecycle) run(ctx context.Context, c *change) outcome {
	// 1. Record.
	put, err := l.record(ctx, c)
	if len(put) == 0 {
		return outcome{err: err}
	}
	res := outcome{err: err}

	// An end's rotation comes before the end is stored: every replica
	// that applies the stored end then reloads the roots of the ended
	// grants' scopes (store.Options.Ended) and finds the new one, so no
	// replica grants the same host again under the root a revocation
	// meant to retire (issue 29). A rotation that fails does not keep
	// the end: it is reported, as before, and the schedule retries.
	var rotateErr error
	if c.rotate != "" {
		rotateErr = l.rotate(ctx, put, c.rotate)
	}

	// 2. Store.
	var storeErr error
	if res.done, storeErr = l.store(ctx, c, put); storeErr != nil {
		if c.grant != nil {
			if c.storeFailure != "" {
				why := c.storeFailure
				if nvmegate.ErrorCode(storeErr) == nvmegate.ECONFLICT { // a refusal: say which
					why += ": " + nvmegate.ErrorMessage(storeErr)
				}
				l.failed(ctx, c, why)
			}
			return outcome{err: storeErr}
		}
		res.err = errors.Join(res.err, storeErr)
	}

	// 3. Program.
	if c.grant == nil {
		followed, err := l.programEnds(ctx, c.target, res.done)
		res.unfollowed = err
		l.settle(ctx, followed)
	} else if err := l.program(ctx, c); err != nil {
		// 4. Compensate.
		l.log.ErrorContext(ctx, c.op+": target did not take the change; undone", "target", c.target, "grant", c.grant.ID, "err", err)
		l.compensate(ctx, c)
		return outcome{err: c.refusal}
	} else {
		// The target's state left the hosts of superseded grants on
		// another host entry (c.hosts names them).
		l.settle(ctx, pendingOf(c.superseded))
	}
	res.unfollowed = errors.Join(res.unfollowed, rotateErr)
	return res
}

// record makes the step's entries durable and returns the grants that may
// change.
func (l *Lifecycle) record(ctx context.Context, c *change) ([]*nvmegate.Grant, error) {
	if c.grant != nil && c.opening != nil && l.grants.Journaled() {
		// Recorded with its commit (store): one durable round.
		if c.check != nil {
			if why, err := c.check(); err != nil {
				l.failed(ctx, c, why)
				return nil, err
			}
		}
		return []*nvmegate.Grant{c.grant}, nil
	}
	if c.grant != nil {
		idx, _, err := l.audit.Append(ctx, c.entry)
		if err != nil {
			l.log.ErrorContext(ctx, c.op+": not recorded; nothing changed", "grant", c.grant.ID, "err", err)
			return nil, ErrUnrecorded
		}
		c.grant.AuditIndex = idx
		if c.check != nil {
			if why, err := c.check(); err != nil {
				l.failed(ctx, c, why)
				return nil, err
			}
		}
		return []*nvmegate.Grant{c.grant}, nil
	}
	if l.recordsWithCommit(c) {
		// Recorded with their commit (store): one durable round.
		put := make([]*nvmegate.Grant, len(c.ends))
		for i, g := range c.ends {
			g.State, g.RemovalPending = c.state, true
			put[i] = g
		}
		return put, nil
	}
	// Appended together, the entries share commits.
	unrecorded := make([]error, len(c.endEntries))
	var wg sync.WaitGroup
	for i, e := range c.endEntries {
		wg.Go(func() { _, _, unrecorded[i] = l.audit.Append(ctx, e) })
	}
	wg.Wait()
	var put []*nvmegate.Grant
	var errs []error
	for i, g := range c.ends {
		if i < len(unrecorded) && unrecorded[i] != nil {
			if !c.endUnrecorded {
				errs = append(errs, fmt.Errorf("grant %s not recorded, not ended: %w", g.ID, unrecorded[i]))
				continue
			}
			l.log.ErrorContext(ctx, c.op+" entry not recorded; the grant is ended all the same", "grant", g.ID, "err", unrecorded[i])
		}
		// Pending until the target acknowledges a state without the host.
		g.State, g.RemovalPending = c.state, true
		put = append(put, g)
	}
	return put, errors.Join(errs...)
}

// store stores put in one commit (with an opening's moves) and returns
// what it stored.
func (l *Lifecycle) store(ctx context.Context, c *change, put []*nvmegate.Grant) ([]*nvmegate.Grant, error) {
	if c.grant != nil {
		var err error
		if c.opening != nil && l.grants.Journaled() {
			c.superseded, err = l.grants.OpenGrantRecorded(ctx, c.grant, ids(c.moving), c.supersede, c.binding, *c.opening)
			if errors.Is(err, audit.ErrUnavailable) || errors.Is(err, audit.ErrClosed) || errors.Is(err, audit.ErrFailed) {
				l.log.ErrorContext(ctx, c.op+": not recorded; nothing changed", "grant", c.grant.ID, "err", err)
				return nil, ErrUnrecorded
			}
		} else {
			c.superseded, err = l.grants.OpenGrant(ctx, c.grant, ids(c.moving), c.supersede, c.binding)
		}
		if err != nil {
			return nil, err
		}
		// The commit found them: one the caller did not see (a
		// concurrent connect of the node) on another host entry is the
		// target's to remove too.
		for _, r := range nvmegate.HostRefs(c.superseded...) {
			if !slices.Contains(c.hosts, r) {
				c.hosts = append(c.hosts, r)
			}
		}
		return put, nil
	}
	recorded := l.recordsWithCommit(c)
	putAll := func(gs []*nvmegate.Grant, entries []audit.Entry) error {
		if recorded {
			return l.grants.PutGrantsRecorded(ctx, gs, entries)
		}
		return l.put(ctx, gs...)
	}
	// Many ends go in chunks (Config.EndChunk): the grants of a chunk end
	// together, and a chunk refused is tried again one grant at a time.
	// Until the last chunk, some of the grants have ended and the rest
	// not yet (docs/PERFORMANCE.md measures that window); a job's
	// finish refuses new grants before the first.
	var stored []*nvmegate.Grant
	var errs []error
	for from := 0; from < len(put); from += l.endChunk {
		to := min(from+l.endChunk, len(put))
		var chunkEntries []audit.Entry
		if recorded {
			chunkEntries = c.endEntries[from:to]
		}
		if err := putAll(put[from:to], chunkEntries); err == nil {
			stored = append(stored, put[from:to]...)
			continue
		}
		for i := from; i < to; i++ {
			g := put[i]
			var entries []audit.Entry
			if recorded {
				entries = c.endEntries[i : i+1]
			}
			// A conflict is a grant that cannot change that way (its job,
			// node, host or subsystem): there is nothing to end.
			if err := putAll([]*nvmegate.Grant{g}, entries); err != nil && nvmegate.ErrorCode(err) != nvmegate.ECONFLICT {
				errs = append(errs, fmt.Errorf("grant %s: %w", g.ID, err))
				continue
			}
			stored = append(stored, g)
		}
	}
	return stored, errors.Join(errs...)
}

// recordsWithCommit says whether an end's entries are made durable in its
// commit (a journaled store, and an entry for each grant) rather than
// appended before it.
func (l *Lifecycle) recordsWithCommit(c *change) bool {
	return c.grant == nil && len(c.endEntries) > 0 && len(c.endEntries) == len(c.ends) && l.grants.Journaled()
}

func (l *Lifecycle) put(ctx context.Context, gs ...*nvmegate.Grant) error {
	return l.grants.PutGrantsMoving(ctx, gs, nil, nil, nvmegate.HostEntry{})
}

// program tells an opening's target of the host entries it changed.
func (l *Lifecycle) program(ctx context.Context, c *change) error {
	if len(c.hosts) == 0 {
		return nil
	}
	return l.targets.Program(ctx, c.target, c.hosts...)
}

// programEnds tells the targets of ended grants gs (target, if set, is
// theirs) of their host entries, and returns the grants whose target
// acknowledged — with those whose subsystem or target is gone from the
// inventory, which no target is told of any more — and why the others'
// did not.
func (l *Lifecycle) programEnds(ctx context.Context, target string, gs []*nvmegate.Grant) ([]*nvmegate.Grant, error) {
	var (
		order    []string
		byTarget = map[string][]*nvmegate.Grant{}
		followed []*nvmegate.Grant
	)
	for _, g := range gs {
		id := target
		if id == "" {
			t, err := l.targetOf(ctx, g)
			if nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
				followed = append(followed, g)
				continue
			}
			if err != nil {
				return followed, err
			}
			id = t.ID
		}
		if _, ok := byTarget[id]; !ok {
			order = append(order, id)
		}
		byTarget[id] = append(byTarget[id], g)
	}
	var errs []error
	for _, id := range order {
		if err := l.targets.Program(ctx, id, nvmegate.HostRefs(byTarget[id]...)...); err != nil {
			errs = append(errs, fmt.Errorf("target %s: %w", id, err))
			continue
		}
		followed = append(followed, byTarget[id]...)
	}
	return followed, errors.Join(errs...)
}

// settle records that the targets of ended grants gs removed their hosts.
// A failure leaves them pending, which Settle retries (harmless: the
// target is told again).
func (l *Lifecycle) settle(ctx context.Context, gs []*nvmegate.Grant) {
	if len(gs) == 0 {
		return
	}
	if err := l.grants.SettleRemovals(ctx, ids(gs)); err != nil {
		l.log.WarnContext(ctx, "removals acknowledged by the targets, not yet recorded; retried", "grants", len(gs), "err", err)
		return
	}
	for _, g := range gs {
		g.RemovalPending = false
	}
}

// compensate undoes an opening the target did not take, whatever the
// caller does meanwhile: the node keeps its other grants at the keys it
// holds, the grant goes back (or ends), the target follows the store back
// (best effort: the reconciler retries), and the failure is recorded.
func (l *Lifecycle) compensate(ctx context.Context, c *change) {
	ctx = context.WithoutCancel(ctx)
	// Each moved grant goes back only while it still has the grant's
	// entry: a later move stays.
	moved := c.grant.HostEntry()
	for _, b := range c.moving {
		if err := l.grants.PutGrantsMoving(ctx, nil, []string{b.ID}, &moved, b.HostEntry()); err != nil {
			l.log.ErrorContext(ctx, c.op+": a grant sharing the host entry was not put back", "grant", b.ID, "with", c.grant.ID, "err", err)
		}
	}
	why := c.refused
	pending := pendingOf(c.superseded) // ended on another host entry, unless put back
	if undo := c.undo; undo != nil {
		if err := l.put(ctx, undo); err != nil {
			l.log.ErrorContext(ctx, c.op+": grant not undone in the store", "grant", c.grant.ID, "err", err)
		}
	} else {
		// A new grant: revoked, pending until the target follows back
		// (it may hold the host), and the grants it superseded are the
		// node's again.
		back, err := l.grants.UndoOpening(ctx, c.grant)
		if err != nil {
			// At least the refused grant must not stay active: end it
			// alone (what it superseded stays ended).
			l.log.ErrorContext(ctx, c.op+": grant not undone in the store; revoking it alone", "grant", c.grant.ID, "err", err)
			c.grant.State, c.grant.RemovalPending, c.grant.SupersededBy = nvmegate.GrantRevoked, true, ""
			if err := l.put(ctx, c.grant); err != nil {
				l.log.ErrorContext(ctx, c.op+": grant not revoked in the store; it stays active until its expiry", "grant", c.grant.ID, "err", err)
			} else {
				pending = append(pending, c.grant)
			}
		} else {
			c.grant.State, c.grant.RemovalPending = nvmegate.GrantRevoked, true
			pending = append(withoutIDs(pending, back), c.grant)
			if len(back) > 0 {
				why += "; the node keeps grant " + strings.Join(ids(back), ", ")
			}
		}
	}
	if err := l.targets.Program(ctx, c.target, c.hosts...); err != nil {
		l.log.ErrorContext(ctx, c.op+": target not reprogrammed after the undo", "target", c.target, "err", err)
	} else {
		l.settle(ctx, pending)
	}
	l.failed(ctx, c, why)
}

// pendingOf are those of gs pending removal.
func pendingOf(gs []*nvmegate.Grant) []*nvmegate.Grant {
	var out []*nvmegate.Grant
	for _, g := range gs {
		if g.RemovalPending {
			out = append(out, g)
		}
	}
	return out
}

// withoutIDs is gs without the grants of drop.
func withoutIDs(gs, drop []*nvmegate.Grant) []*nvmegate.Grant {
	out := gs[:0:0]
	for _, g := range gs {
		if !slices.ContainsFunc(drop, func(d *nvmegate.Grant) bool { return d.ID == g.ID }) {
			out = append(out, g)
		}
	}
	return out
}

// failed records that an opening policy allowed failed on the way, and
// why (best effort: the caller is refused anyway).
func (l *Lifecycle) failed(ctx context.Context, c *change, why string) {
	e := c.deny
	e.Time, e.Detail = l.now(), e.Detail+": "+why
	if _, _, err := l.audit.Append(context.WithoutCancel(ctx), e); err != nil {
		l.log.ErrorContext(ctx, c.op+" failure not recorded", "grant", c.grant.ID, "err", err)
	}
}

// rotate rotates the roots the hosts of gs knew.
func (l *Lifecycle) rotate(ctx context.Context, gs []*nvmegate.Grant, why string) error {
	var order []string
	seen := map[string]bool{}
	for _, g := range gs {
		if !seen[g.Scope()] {
			seen[g.Scope()] = true
			order = append(order, g.Scope())
		}
	}
	var errs []error
	for _, sc := range order {
		if err := l.keys.Revoked(ctx, sc, why); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
