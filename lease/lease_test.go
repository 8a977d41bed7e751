package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/lease"
	"github.com/nvmegate/nvmegate/store"
)

// appendFunc is an AuditLog of one function: a test's look at the world
// at the moment something is recorded.
type appendFunc func(ctx context.Context, e audit.Entry) (uint64, [32]byte, error)

func (f appendFunc) Append(ctx context.Context, e audit.Entry) (uint64, [32]byte, error) {
	return f(ctx, e)
}

// programFunc is a Targets of one function.
type programFunc func(ctx context.Context, id string, changed ...nvmegate.HostRef) error

func (f programFunc) Program(ctx context.Context, id string, changed ...nvmegate.HostRef) error {
	return f(ctx, id, changed...)
}

// A grant is on the record before the store or the target changes, and on
// the target before Issue returns: the entry carries the scope, the
// decision and the fingerprints of what was issued, never a secret.
func TestIssue(t *testing.T) {
	var looked atomic.Bool
	w := newPlainWorld(t, func(w *world, c *lease.Config) {
		c.Audit = appendFunc(func(ctx context.Context, e audit.Entry) (uint64, [32]byte, error) {
			if e.Kind == audit.EventGrant {
				if _, err := w.db.Grant(ctx, e.GrantID); nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
					t.Errorf("grant %s stored before its entry (%v)", e.GrantID, err)
				}
				if w.allowed(node1, sub1) {
					t.Error("the target allows the host before the grant's entry")
				}
				looked.Store(true)
			}
			return w.log.Append(ctx, e)
		})
	})
	r := w.request(node1, sub1, nvmegate.Obligations{MinHash: "sha384", MaxTTL: 30 * time.Minute})
	is, err := w.lc.Issue(w.ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !looked.Load() {
		t.Fatal("no grant entry")
	}
	g := w.grant(is.Grant.ID)
	now := w.clock.Now()
	if g.State != nvmegate.GrantActive || g.Node != node1 || g.HostNQN != hostNQNs[node1] || g.SubsystemNQN != sub1 || g.JobID != jobID ||
		g.KeyVersion != 1 || g.KeyScope != keyScope || g.DHCHAPHash != "sha384" || !g.ExpiresAt.Equal(now.Add(30*time.Minute)) ||
		g.DecisionID != r.Decision.ID {
		t.Fatalf("stored grant %+v", g)
	}
	recs := w.entries(audit.EventGrant)
	if len(recs) != 1 || g.AuditIndex != recs[0].Index {
		t.Fatalf("%d grant entries; the grant's audit index %d", len(recs), g.AuditIndex)
	}
	e := recs[0].Entry
	if e.GrantID != g.ID || e.Caller != node1 || e.Tenant != "acme" || e.JobID != jobID || e.HostNQN != g.HostNQN ||
		e.SubsystemNQN != sub1 || !e.ExpiresAt.Equal(g.ExpiresAt) || e.Detail != "access.connect "+sub1 ||
		e.Decision == nil || e.Decision.ID != r.Decision.ID || !e.Decision.Allow ||
		len(e.Namespaces) != 1 || e.Namespaces[0].DatasetDigest != digest || e.Namespaces[0].Mode != nvmegate.ModeReadOnly {
		t.Fatalf("grant entry %+v", e)
	}
	if len(e.Keys) != 2 || e.Keys[0] != (audit.KeyRef{Class: "access_root", ID: keyScope, Version: 1, Fingerprint: is.Credentials.RootFingerprint}) ||
		e.Keys[1] != (audit.KeyRef{Class: "dhchap_host", ID: g.HostNQN, Version: 1, Fingerprint: is.Credentials.HostSecretFingerprint}) {
		t.Fatalf("grant entry keys %+v", e.Keys)
	}
	if strings.Contains(string(recs[0].Raw), "DHHC-1") {
		t.Fatal("the grant entry holds a secret")
	}
	if !w.allowed(node1, sub1) || w.hostKey(node1) != is.Credentials.HostSecret || w.allowed(node1, sub2) {
		t.Fatalf("target: allowed on %s %v, on %s %v; key matches %v", sub1, w.allowed(node1, sub1), sub2, w.allowed(node1, sub2),
			w.hostKey(node1) == is.Credentials.HostSecret)
	}
}

// A grant whose entry cannot be made durable is not made: nothing is
// stored and the target is not told.
func TestIssueUnrecorded(t *testing.T) {
	w := newWorld(t)
	w.must(w.log.Close())
	_, err := w.lc.Issue(w.ctx, w.request(node1, sub1, nvmegate.Obligations{}))
	if !errors.Is(err, lease.ErrUnrecorded) {
		t.Fatalf("issue with the log closed: %v", err)
	}
	wantCode(t, err, nvmegate.EUNAVAILABLE, "nothing was changed")
	gs, _, err := w.db.ListGrants(w.ctx, store.GrantFilter{}, store.Page{})
	if err != nil || len(gs) != 0 {
		t.Fatalf("grants stored: %v %v", gs, err)
	}
	if w.allowed(node1, sub1) {
		t.Fatal("the target allows the host")
	}
}

// The job's state is checked again once the grant is on the record: a job
// no longer active gets no grant, and the log says why.
func TestIssueJobNoLongerActive(t *testing.T) {
	w := newWorld(t)
	r := issueInFinishedJob(t, w)
	grants, denies := w.entries(audit.EventGrant), w.entries(audit.EventDeny)
	if len(grants) != 0 || len(denies) != 1 {
		t.Fatalf("%d grant and %d deny entries, want 0 and 1: the grant's entry is made with its commit, which never ran", len(grants), len(denies))
	}
	if d := denies[0].Entry; d.GrantID == "" || d.Detail != "access.connect job-1: job job-1 is finished" || d.Decision == nil || d.Decision.ID != r.Decision.ID {
		t.Fatalf("deny entry %+v", d)
	}
}

// issueInFinishedJob issues a grant decided while the job was active to
// a request whose job has finished since: it must be refused.
func issueInFinishedJob(t *testing.T, w *world) lease.Request {
	t.Helper()
	r := w.request(node1, sub1, nvmegate.Obligations{})
	j := *r.Scope.Job
	j.State = nvmegate.JobFinished
	r.Scope.Job = &j
	_, err := w.lc.Issue(w.ctx, r)
	wantCode(t, err, nvmegate.ECONFLICT, "job job-1 is finished; no grant")
	return r
}

// On a store that is not journaled the grant's entry comes first: then
// the check runs, and the failure is recorded after it.
func TestIssueJobNoLongerActiveUnjournaled(t *testing.T) {
	w := newPlainWorld(t)
	r := issueInFinishedJob(t, w)
	grants, denies := w.entries(audit.EventGrant), w.entries(audit.EventDeny)
	if len(grants) != 1 || len(denies) != 1 {
		t.Fatalf("%d grant and %d deny entries, want 1 and 1", len(grants), len(denies))
	}
	if d := denies[0].Entry; d.GrantID != grants[0].Entry.GrantID || d.Detail != "access.connect job-1: job job-1 is finished" ||
		d.Decision == nil || d.Decision.ID != r.Decision.ID || d.Time.IsZero() {
		t.Fatalf("deny entry %+v", d)
	}
	if gs, _ := w.db.NodeActiveGrants(w.ctx, node1); len(gs) != 0 || w.allowed(node1, sub1) {
		t.Fatalf("grants %v; allowed %v", gs, w.allowed(node1, sub1))
	}
}

// A new connect supersedes the node's earlier grant on the subsystem in
// the job, in the same commit.
func TestIssueSupersedes(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	b := w.issue(node1, sub1)
	if g := w.grant(a.Grant.ID); g.State != nvmegate.GrantReleased || g.SupersededBy != b.Grant.ID || g.RemovalPending {
		t.Fatalf("superseded grant is %s, superseded by %q, pending %v; want released by %s", g.State, g.SupersededBy, g.RemovalPending, b.Grant.ID)
	}
	if es := w.entries(audit.EventGrant); len(es) != 2 || !strings.Contains(es[1].Entry.Detail, "; supersedes "+a.Grant.ID) {
		t.Fatalf("grant entries %+v: the second names the grant it supersedes", es)
	}
	gs, err := w.db.NodeActiveGrants(w.ctx, node1)
	if err != nil || len(gs) != 1 || gs[0].ID != b.Grant.ID {
		t.Fatalf("active grants %v %v, want only %s", gs, err, b.Grant.ID)
	}
	if !w.allowed(node1, sub1) || w.hostKey(node1) != b.Credentials.HostSecret {
		t.Fatal("the target does not hold the new grant")
	}
}

// A connect the target refuses supersedes nothing: the node keeps the
// grant it had, active and on the target at its keys.
func TestIssueRefusedKeepsTheEarlierGrant(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	a := w.issue(node1, sub1)
	ref.n.Store(1)
	_, err := w.lc.Issue(w.ctx, w.request(node1, sub1, nvmegate.Obligations{}))
	wantCode(t, err, nvmegate.EUNAVAILABLE, "no grant was made")
	if g := w.grant(a.Grant.ID); g.State != nvmegate.GrantActive {
		t.Fatalf("a refused connect ended the node's earlier grant: %s", g.State)
	}
	gs, err := w.db.NodeActiveGrants(w.ctx, node1)
	if err != nil || len(gs) != 1 || gs[0].ID != a.Grant.ID {
		t.Fatalf("active grants %v %v, want only %s", gs, err, a.Grant.ID)
	}
	if !w.allowed(node1, sub1) || w.hostKey(node1) != a.Credentials.HostSecret {
		t.Fatal("the target does not hold the earlier grant after the refused connect")
	}
	denies := w.entries(audit.EventDeny)
	if len(denies) != 1 || !strings.HasSuffix(denies[0].Entry.Detail, "did not accept the host; the node keeps grant "+a.Grant.ID) {
		t.Fatalf("deny entries %+v: want the refusal, naming the grant kept", denies)
	}
	if p, _ := w.db.PendingRemovals(w.ctx); len(p) != 0 {
		t.Fatalf("pending removals %v after the target followed back", p)
	}
}

// After a rotation a renewal gets the new root's credentials, on the
// target before it returns; the node's grant on the target's other
// subsystem shares the host entry and moves with it, and the renewal's
// entry says so.
func TestRenewAfterRotation(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	b := w.issue(node1, sub2)
	if a.Credentials.HostSecret != b.Credentials.HostSecret {
		t.Fatal("two secrets for one host on one nvmet target")
	}
	if _, err := w.keys.Rotate(w.ctx, keyScope, "test"); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(2 * time.Minute) // within the key manager's staleness bound (no refresh runs here)
	r, err := w.lc.Renew(w.ctx, w.grant(a.Grant.ID), w.request(node1, sub1, nvmegate.Obligations{}))
	if err != nil {
		t.Fatal(err)
	}
	if r.Grant.KeyVersion != 2 || r.Credentials.HostSecret == a.Credentials.HostSecret || !r.Grant.ExpiresAt.Equal(w.clock.Now().Add(time.Hour)) {
		t.Fatalf("renewed: v%d, expires %v", r.Grant.KeyVersion, r.Grant.ExpiresAt)
	}
	if w.hostKey(node1) != r.Credentials.HostSecret || !w.allowed(node1, sub1) || !w.allowed(node1, sub2) {
		t.Fatal("the target does not hold the renewed key on both subsystems")
	}
	renews := w.entries(audit.EventRenew)
	if len(renews) != 1 {
		t.Fatalf("%d renew entries", len(renews))
	}
	e := renews[0].Entry
	if g := w.grant(a.Grant.ID); g.KeyVersion != 2 || g.AuditIndex != renews[0].Index {
		t.Fatalf("stored renewal %+v", g)
	}
	if g := w.grant(b.Grant.ID); g.KeyVersion != 2 || g.State != nvmegate.GrantActive {
		t.Fatalf("the grant sharing the host entry: %+v", g)
	}
	if !strings.HasPrefix(e.Detail, "access.renew "+sub1+"; moves "+b.Grant.ID) || e.Keys[0].Version != 2 || e.GrantID != a.Grant.ID {
		t.Fatalf("renew entry %+v", e)
	}
}

// A release ends the grant and the target stops allowing the host. The
// gateway records the release (the call's entry); the lease writes none.
func TestRelease(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	b := w.issue(node2, sub1)
	w.must(w.lc.Release(w.ctx, w.grant(a.Grant.ID)))
	if s := w.grant(a.Grant.ID).State; s != nvmegate.GrantReleased {
		t.Fatalf("released grant is %s", s)
	}
	if w.allowed(node1, sub1) || !w.allowed(node2, sub1) || w.hostKey(node2) != b.Credentials.HostSecret {
		t.Fatal("the target did not drop only the released host")
	}
	if n := len(w.entries(audit.EventRelease)); n != 0 {
		t.Fatalf("%d release entries from the lease", n)
	}
}

// A release whose target does not take it is not answered as done: the
// grant is released in the store but pending removal, the host is still
// on the target, and the caller is told so. A retried release, and
// Settle, tell the target again; once it follows, the removal settles.
func TestReleaseTargetDoesNotFollow(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	a := w.issue(node1, sub1)
	ref.n.Store(2)
	err := w.lc.Release(w.ctx, w.grant(a.Grant.ID))
	wantCode(t, err, nvmegate.EUNAVAILABLE, "has not acknowledged removing its host", "removal pending")
	if strings.Contains(err.Error(), errDiskOnFire.Error()) {
		t.Fatalf("the caller's error carries the target's: %v", err)
	}
	g := w.grant(a.Grant.ID)
	if g.State != nvmegate.GrantReleased || !g.RemovalPending || !w.allowed(node1, sub1) {
		t.Fatalf("after an unfollowed release: %s pending=%v allowed=%v", g.State, g.RemovalPending, w.allowed(node1, sub1))
	}
	pending, _, err := w.db.ListGrants(w.ctx, store.GrantFilter{RemovalPending: true}, store.Page{})
	if err != nil || len(pending) != 1 || pending[0].ID != a.Grant.ID {
		t.Fatalf("pending removals listed: %v %v", pending, err)
	}
	// The retry is refused again (the target still does not follow)...
	wantCode(t, w.lc.Release(w.ctx, g), nvmegate.EUNAVAILABLE, "removal pending")
	// ...and then Settle gets it through.
	n, err := w.lc.Settle(w.ctx)
	if err != nil || n != 0 {
		t.Fatalf("Settle: %d pending, %v", n, err)
	}
	if g := w.grant(a.Grant.ID); g.RemovalPending || w.allowed(node1, sub1) {
		t.Fatalf("after Settle: pending=%v allowed=%v", g.RemovalPending, w.allowed(node1, sub1))
	}
	// Released and off the target: a further release is answered as done.
	w.must(w.lc.Release(w.ctx, w.grant(a.Grant.ID)))
	if n, err := w.lc.Settle(w.ctx); n != 0 || err != nil {
		t.Fatalf("Settle with nothing pending: %d %v", n, err)
	}
}

// A retried release settles a pending removal once the target follows;
// a revocation and an expiry whose target does not follow leave their
// grants pending too, until Settle.
func TestEndsStayPendingUntilTheTargetFollows(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	a := w.issue(node1, sub1)
	b := w.issue(node2, sub1)
	c := w.issue(node1, sub2)
	ref.n.Store(1)
	wantCode(t, w.lc.Release(w.ctx, w.grant(a.Grant.ID)), nvmegate.EUNAVAILABLE, "removal pending")
	w.must(w.lc.Release(w.ctx, w.grant(a.Grant.ID))) // the target follows now
	if g := w.grant(a.Grant.ID); g.RemovalPending || w.allowed(node1, sub1) {
		t.Fatal("a retried release that the target followed is still pending")
	}

	ref.n.Store(1)
	ended, err := w.lc.Revoke(w.ctx, lease.Selection{GrantID: b.Grant.ID}, "spiffe://nvmegate.test/admin/ops", "test")
	wantCode(t, err, nvmegate.EUNAVAILABLE)
	if len(ended) != 1 || !w.grant(b.Grant.ID).RemovalPending || !w.allowed(node2, sub1) {
		t.Fatalf("an unfollowed revocation: ended %v pending %v", ended, w.grant(b.Grant.ID).RemovalPending)
	}
	w.clock.Advance(2 * time.Hour) // c expires
	ref.n.Store(1)
	if n, err := w.lc.Expire(w.ctx); n != 1 || err != nil {
		t.Fatalf("Expire: %d %v", n, err)
	}
	if g := w.grant(c.Grant.ID); g.State != nvmegate.GrantExpired || !g.RemovalPending {
		t.Fatalf("an unfollowed expiry: %s pending %v", g.State, g.RemovalPending)
	}
	if n, err := w.lc.Settle(w.ctx); n != 0 || err != nil {
		t.Fatalf("Settle: %d pending, %v", n, err)
	}
	for _, id := range []string{b.Grant.ID, c.Grant.ID} {
		if w.grant(id).RemovalPending {
			t.Fatalf("%s still pending after Settle", id)
		}
	}
	if w.allowed(node2, sub1) || w.allowed(node1, sub2) {
		t.Fatal("the target still allows the ended hosts after Settle")
	}
}

// A revocation records each grant (its job, host and subsystem, the
// caller, the reason) and ends it, the target drops the host and the root
// rotates — all of it even when the caller hangs up once it has begun.
func TestRevoke(t *testing.T) {
	var hangUp atomic.Pointer[context.CancelFunc]
	w := newWorld(t, func(w *world, c *lease.Config) {
		c.Targets = programFunc(func(ctx context.Context, id string, changed ...nvmegate.HostRef) error {
			if f := hangUp.Load(); f != nil {
				(*f)()
			}
			return w.agent.Program(ctx, id, changed...)
		})
	})
	a := w.issue(node1, sub1)
	b := w.issue(node2, sub1)
	ctx, cancel := context.WithCancel(w.ctx)
	hangUp.Store(&cancel)
	ids, err := w.lc.Revoke(ctx, lease.Selection{Node: node1}, admin, "revoked: compromised")
	if err != nil || !slices.Equal(ids, []string{a.Grant.ID}) {
		t.Fatalf("revoked %v (%v), want %s", ids, err, a.Grant.ID)
	}
	if ctx.Err() == nil {
		t.Fatal("the caller did not hang up")
	}
	if w.grant(a.Grant.ID).State != nvmegate.GrantRevoked || w.grant(b.Grant.ID).State != nvmegate.GrantActive {
		t.Fatal("revoked the wrong grants")
	}
	if w.allowed(node1, sub1) || !w.allowed(node2, sub1) {
		t.Fatal("the target did not drop only the revoked host")
	}
	revokes := w.entries(audit.EventRevoke)
	if len(revokes) != 1 {
		t.Fatalf("%d revoke entries", len(revokes))
	}
	if e := revokes[0].Entry; e.GrantID != a.Grant.ID || e.Caller != admin || e.JobID != jobID || e.Tenant != "acme" ||
		e.HostNQN != hostNQNs[node1] || e.SubsystemNQN != sub1 || e.Detail != "revoked: compromised" || !e.ExpiresAt.Equal(a.Grant.ExpiresAt) {
		t.Fatalf("revoke entry %+v", e)
	}
	st, err := w.keys.Status(w.ctx, keyScope)
	if err != nil || st.Current != 2 {
		t.Fatalf("root after revocation: %+v %v", st, err)
	}
	_, err = w.lc.Revoke(w.ctx, lease.Selection{}, admin, "everything?")
	wantCode(t, err, nvmegate.EINVALID)
}

// Ending access is the safe direction: on a store that is not journaled,
// a grant whose revoke entry cannot be written is revoked all the same.
func TestRevokeUnrecorded(t *testing.T) {
	w := newPlainWorld(t)
	a := w.issue(node1, sub1)
	w.must(w.log.Close())
	ids, err := w.lc.Revoke(w.ctx, lease.Selection{GrantID: a.Grant.ID}, admin, "revoked: test")
	if err != nil || !slices.Equal(ids, []string{a.Grant.ID}) {
		t.Fatalf("revoked %v (%v)", ids, err)
	}
	if w.grant(a.Grant.ID).State != nvmegate.GrantRevoked || w.allowed(node1, sub1) {
		t.Fatal("the grant was not ended")
	}
}

// On a journaled store nothing changes unrecorded, an end neither: with
// the log down a revocation is refused, and says so — it never reports a
// grant revoked that the store and the target still hold.
func TestRevokeUnrecordedJournaled(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	w.must(w.log.Close())
	ids, err := w.lc.Revoke(w.ctx, lease.Selection{GrantID: a.Grant.ID}, admin, "revoked: test")
	if err == nil || len(ids) != 0 {
		t.Fatalf("revoked %v (%v) with the log closed", ids, err)
	}
	if w.grant(a.Grant.ID).State != nvmegate.GrantActive || !w.allowed(node1, sub1) {
		t.Fatal("the grant changed though the refusal says it did not")
	}
}

// The end of a job revokes every active grant of it, on the caller's
// authority.
func TestEndJob(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	b := w.issue(node2, sub2)
	const sched = "spiffe://nvmegate.test/tenant/acme/scheduler/slurm"
	ids, err := w.lc.EndJob(w.ctx, jobID, sched, "job job-1 finished")
	slices.Sort(ids)
	want := []string{a.Grant.ID, b.Grant.ID}
	slices.Sort(want)
	if err != nil || !slices.Equal(ids, want) {
		t.Fatalf("ended %v (%v), want %v", ids, err, want)
	}
	for _, id := range want {
		if s := w.grant(id).State; s != nvmegate.GrantRevoked {
			t.Fatalf("grant %s is %s", id, s)
		}
	}
	if w.allowed(node1, sub1) || w.allowed(node2, sub2) {
		t.Fatal("the target still allows the job's hosts")
	}
	revokes := w.entries(audit.EventRevoke)
	if len(revokes) != 2 || revokes[0].Entry.Caller != sched || revokes[1].Entry.Detail != "job job-1 finished" {
		t.Fatalf("revoke entries %+v", revokes)
	}
	if st, err := w.keys.Status(w.ctx, keyScope); err != nil || st.Current != 2 {
		t.Fatalf("root after the job: %+v %v", st, err)
	}
}

// The sweep records each expired grant before it ends it, and the target
// drops the host.
func TestExpire(t *testing.T) {
	w := newWorld(t)
	r := w.request(node1, sub1, nvmegate.Obligations{})
	r.TTL = time.Minute
	is, err := w.lc.Issue(w.ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	b := w.issue(node2, sub1)
	if n, err := w.lc.Expire(w.ctx); err != nil || n != 0 {
		t.Fatalf("nothing expired yet: %d %v", n, err)
	}
	w.clock.Advance(2 * time.Minute)
	if n, err := w.lc.Expire(w.ctx); err != nil || n != 1 {
		t.Fatalf("expired %d (%v), want 1", n, err)
	}
	if s := w.grant(is.Grant.ID).State; s != nvmegate.GrantExpired {
		t.Fatalf("expired grant is %s", s)
	}
	if w.allowed(node1, sub1) || !w.allowed(node2, sub1) || w.hostKey(node2) != b.Credentials.HostSecret {
		t.Fatal("the target did not drop only the expired host")
	}
	expires := w.entries(audit.EventExpire)
	if len(expires) != 1 {
		t.Fatalf("%d expire entries", len(expires))
	}
	if e := expires[0].Entry; e.GrantID != is.Grant.ID || e.Caller != "" || e.JobID != jobID || e.Detail != "grant expired" ||
		!e.ExpiresAt.Equal(is.Grant.ExpiresAt) {
		t.Fatalf("expire entry %+v", e)
	}
	if n, err := w.lc.Expire(w.ctx); err != nil || n != 0 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
}

// An expired grant is not ended unrecorded: the next sweep retries it.
func TestExpireUnrecorded(t *testing.T) {
	w := newWorld(t)
	r := w.request(node1, sub1, nvmegate.Obligations{})
	r.TTL = time.Minute
	if _, err := w.lc.Issue(w.ctx, r); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(2 * time.Minute)
	w.must(w.log.Close())
	if n, err := w.lc.Expire(w.ctx); err == nil || n != 0 {
		t.Fatalf("expired %d (%v) with the log closed", n, err)
	}
	if gs, err := w.db.ExpiredGrants(w.ctx); err != nil || len(gs) != 1 {
		t.Fatalf("still to sweep: %v %v", gs, err)
	}
}

// A target that does not take a new grant: the grant is ended, the node's
// grant that would have moved with it is put back at the keys the node
// holds, the target follows the store back, and the log says why.
func TestIssueTargetRefuses(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	b := w.issue(node1, sub2) // at root version 1
	if _, err := w.keys.Rotate(w.ctx, keyScope, "test"); err != nil {
		t.Fatal(err)
	}
	ref.n.Store(1)
	r := w.request(node1, sub1, nvmegate.Obligations{})
	_, err := w.lc.Issue(w.ctx, r)
	wantCode(t, err, nvmegate.EUNAVAILABLE, "target stor-eu-1 did not accept the host in time; no grant was made")
	grants := w.entries(audit.EventGrant)
	if len(grants) != 2 || !strings.Contains(grants[1].Entry.Detail, "moves "+b.Grant.ID) {
		t.Fatalf("grant entries %+v", grants)
	}
	refused := grants[1].Entry.GrantID
	if s := w.grant(refused).State; s != nvmegate.GrantRevoked {
		t.Fatalf("the refused grant is %s", s)
	}
	if g := w.grant(b.Grant.ID); g.KeyVersion != 1 || g.State != nvmegate.GrantActive {
		t.Fatalf("the sibling was not put back: %+v", g)
	}
	denies := w.entries(audit.EventDeny)
	if len(denies) != 1 {
		t.Fatalf("%d deny entries", len(denies))
	}
	if d := denies[0].Entry; d.GrantID != refused || d.Detail != "access.connect job-1: target stor-eu-1 did not accept the host" ||
		d.Decision == nil || d.Decision.ID != r.Decision.ID || d.SubsystemNQN != sub1 {
		t.Fatalf("deny entry %+v", d)
	}
	if w.allowed(node1, sub1) || !w.allowed(node1, sub2) || w.hostKey(node1) != b.Credentials.HostSecret {
		t.Fatal("the target does not hold the node's earlier grant at its old key")
	}
}

// A target that does not take a renewal's new keys: the grant keeps its
// old ones (and its old expiry), and the log says why.
func TestRenewTargetRefuses(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	a := w.issue(node1, sub1)
	if _, err := w.keys.Rotate(w.ctx, keyScope, "test"); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(time.Minute)
	ref.n.Store(1)
	_, err := w.lc.Renew(w.ctx, w.grant(a.Grant.ID), w.request(node1, sub1, nvmegate.Obligations{}))
	wantCode(t, err, nvmegate.EUNAVAILABLE, "did not accept the new keys; the grant keeps its old ones")
	g := w.grant(a.Grant.ID)
	if g.KeyVersion != 1 || g.State != nvmegate.GrantActive || !g.ExpiresAt.Equal(a.Grant.ExpiresAt) || g.AuditIndex != a.Grant.AuditIndex {
		t.Fatalf("grant after the refused renewal %+v, want %+v", g, a.Grant)
	}
	if n := len(w.entries(audit.EventRenew)); n != 1 {
		t.Fatalf("%d renew entries (the renewal is recorded before the target is asked)", n)
	}
	denies := w.entries(audit.EventDeny)
	if len(denies) != 1 || denies[0].Entry.Detail != "access.renew job-1: target stor-eu-1 did not accept the new keys" {
		t.Fatalf("deny entries %+v", denies)
	}
	if w.hostKey(node1) != a.Credentials.HostSecret || !w.allowed(node1, sub1) {
		t.Fatal("the target does not hold the old key")
	}
}

// A superseded grant could come back if its successor's connect were
// refused; a release or a revocation of it makes it final.
func TestEndingASupersededGrantMakesItFinal(t *testing.T) {
	w := newWorld(t)
	o := w.issue(node1, sub1)
	w.issue(node1, sub1)
	if g := w.grant(o.Grant.ID); g.SupersededBy == "" {
		t.Fatal("the earlier grant does not wait on its successor")
	}
	if err := w.lc.Release(w.ctx, w.grant(o.Grant.ID)); err != nil {
		t.Fatal(err)
	}
	if g := w.grant(o.Grant.ID); g.State != nvmegate.GrantReleased || g.SupersededBy != "" {
		t.Fatalf("released: %s, waiting on %q; want final", g.State, g.SupersededBy)
	}

	o2 := w.issue(node2, sub1)
	w.issue(node2, sub1)
	ids, err := w.lc.Revoke(w.ctx, lease.Selection{GrantID: o2.Grant.ID}, admin, "revoked: test")
	if err != nil || !slices.Equal(ids, []string{o2.Grant.ID}) {
		t.Fatalf("revoked %v, %v", ids, err)
	}
	if g := w.grant(o2.Grant.ID); g.State != nvmegate.GrantRevoked || g.SupersededBy != "" {
		t.Fatalf("revoked: %s, waiting on %q", g.State, g.SupersededBy)
	}
}

// undoFails is the store with UndoOpening failing.
type undoFails struct{ *store.DB }

func (undoFails) UndoOpening(context.Context, *nvmegate.Grant) ([]*nvmegate.Grant, error) {
	return nil, errors.New("undo: store unavailable")
}

// A refused connect whose undo cannot commit still leaves no active grant
// the caller was told it did not get: it is revoked alone.
func TestIssueRefusedUndoFails(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) {
		ref = &refusing{next: w.agent}
		c.Targets = ref
		c.Grants = undoFails{w.db}
	})
	w.issue(node1, sub1)
	ref.n.Store(1)
	_, err := w.lc.Issue(w.ctx, w.request(node1, sub1, nvmegate.Obligations{}))
	wantCode(t, err, nvmegate.EUNAVAILABLE, "no grant was made")
	gs, err := w.db.NodeActiveGrants(w.ctx, node1)
	if err != nil || len(gs) != 0 {
		t.Fatalf("active grants %v, %v: want none (the earlier one superseded, the refused one revoked)", gs, err)
	}
}

// A node whose host binding is removed, changed or made again while it
// connects is refused in the grant's commit: the binding removed; bound
// again to another NQN; bound again to the same NQN for another tenant
// (the reviewed attack); bound again exactly as before (a new binding all
// the same); and a node decided unbound that got a binding meanwhile. Each
// refusal is recorded, and the node keeps only what it had.
func TestIssueBindingChangedMeanwhile(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	bind := func(nqn, tenant string) {
		w.must(w.db.CreateHostBinding(w.ctx, &nvmegate.HostBinding{SPIFFEID: node1, HostNQN: nqn, Tenant: tenant}))
	}
	unbind := func() { w.must(w.db.DeleteHostBinding(w.ctx, node1)) }
	for _, tc := range []struct {
		name   string
		change func()
	}{
		{"removed", unbind},
		{"bound to another NQN", func() { unbind(); bind("nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-00000000000a", "acme") }},
		{"bound again to the same NQN, for globex", func() { unbind(); bind(hostNQNs[node1], "globex") }},
		{"bound again as before", func() { unbind(); bind(hostNQNs[node1], "acme") }},
	} {
		if _, err := w.db.HostBinding(w.ctx, node1); err != nil { // bound as at the start
			bind(hostNQNs[node1], "acme")
		} else if tc.name != "removed" {
			unbind()
			bind(hostNQNs[node1], "acme")
		}
		r := w.request(node1, sub1, nvmegate.Obligations{})
		if !r.Scope.Bound {
			t.Fatalf("%s: decided unbound", tc.name)
		}
		w.clock.Advance(time.Second) // a binding made again is a new one (its CreatedAt)
		tc.change()
		_, err := w.lc.Issue(w.ctx, r)
		wantCode(t, err, nvmegate.ECONFLICT, "host binding changed while it connected")
		denies := w.entries(audit.EventDeny)
		if len(denies) == 0 || !strings.Contains(denies[len(denies)-1].Entry.Detail, "host binding changed while it connected") {
			t.Fatalf("%s: deny entries %+v", tc.name, denies)
		}
		gs, err := w.db.NodeActiveGrants(w.ctx, node1)
		if err != nil || len(gs) != 1 || gs[0].ID != a.Grant.ID {
			t.Fatalf("%s: active grants %v (%v), want the earlier one alone", tc.name, gs, err)
		}
	}
	// Decided unbound; bound meanwhile.
	unbind()
	r := w.request(node1, sub1, nvmegate.Obligations{})
	bind(hostNQNs[node1], "acme")
	_, err := w.lc.Issue(w.ctx, r)
	wantCode(t, err, nvmegate.ECONFLICT, "host binding changed while it connected")
	// Unchanged, the same connect is granted.
	if _, err := w.lc.Issue(w.ctx, w.request(node1, sub1, nvmegate.Obligations{})); err != nil {
		t.Fatal(err)
	}
}

// A renewal under stronger obligations that the target refuses leaves the
// grant as it was, but obliged to renew within reauth_within: it does not
// keep its weaker keys until its expiry.
func TestRenewRefusedUnderStrongerObligationsMustRenew(t *testing.T) {
	var ref *refusing
	w := newWorld(t, func(w *world, c *lease.Config) { ref = &refusing{next: w.agent}; c.Targets = ref })
	a := w.issue(node1, sub1)
	ref.n.Store(1)
	stronger := nvmegate.Obligations{Bidirectional: true, MinHash: "sha384", ReauthWithin: 90 * time.Second}
	_, err := w.lc.Renew(w.ctx, w.grant(a.Grant.ID), w.request(node1, sub1, stronger))
	wantCode(t, err, nvmegate.EUNAVAILABLE, "keeps its old ones")
	g := w.grant(a.Grant.ID)
	if g.State != nvmegate.GrantActive || g.Bidirectional || g.ReauthBy.IsZero() || time.Until(g.ReauthBy) > 90*time.Second ||
		!strings.Contains(g.ReauthWhy, "bidirectional") {
		t.Fatalf("after the refused renewal: %+v", g)
	}
}

// On a journaled store a grant and its entry are one commit: the entry at
// the grant's index is its grant entry, carrying the change that stored
// it, and an end's entry carries the end's change.
func TestIssueRecordedWithItsCommit(t *testing.T) {
	w := newWorld(t)
	a := w.issue(node1, sub1)
	grants := w.entries(audit.EventGrant)
	if len(grants) != 1 {
		t.Fatalf("%d grant entries", len(grants))
	}
	if r := grants[0]; r.Index != a.Grant.AuditIndex || r.Entry.GrantID != a.Grant.ID || r.Entry.Change == nil {
		t.Fatalf("grant entry %d %+v; the grant says index %d", r.Index, r.Entry, a.Grant.AuditIndex)
	}
	if _, err := w.lc.Revoke(w.ctx, lease.Selection{GrantID: a.Grant.ID}, admin, "revoked: test"); err != nil {
		t.Fatal(err)
	}
	revokes := w.entries(audit.EventRevoke)
	if len(revokes) != 1 || revokes[0].Entry.Change == nil || revokes[0].Entry.GrantID != a.Grant.ID {
		t.Fatalf("revoke entries %+v", revokes)
	}
}

// chunkSpy counts the grants each recorded end stored (the real store
// does the storing).
type chunkSpy struct {
	lease.Grants
	mu     sync.Mutex
	chunks []int
}

func (s *chunkSpy) PutGrantsRecorded(ctx context.Context, gs []*nvmegate.Grant, entries []audit.Entry) error {
	s.mu.Lock()
	s.chunks = append(s.chunks, len(gs))
	s.mu.Unlock()
	return s.Grants.PutGrantsRecorded(ctx, gs, entries)
}

// A job's end is stored in chunks of Config.EndChunk grants, each with
// its entries: every grant ends, each recorded once.
func TestEndJobInChunks(t *testing.T) {
	spy := &chunkSpy{}
	w := newWorld(t, func(w *world, c *lease.Config) {
		spy.Grants = c.Grants
		c.Grants, c.EndChunk = spy, 1
	})
	a := w.issue(node1, sub1)
	b := w.issue(node2, sub2)
	c := w.issue(node1, sub2)
	ids, err := w.lc.EndJob(w.ctx, jobID, "spiffe://nvmegate.test/tenant/acme/scheduler/slurm", "job job-1 finished")
	if err != nil || len(ids) != 3 {
		t.Fatalf("ended %v (%v), want 3 grants", ids, err)
	}
	for _, id := range []string{a.Grant.ID, b.Grant.ID, c.Grant.ID} {
		if s := w.grant(id).State; s != nvmegate.GrantRevoked {
			t.Fatalf("grant %s is %s", id, s)
		}
	}
	if fmt.Sprint(spy.chunks) != "[1 1 1]" {
		t.Fatalf("stored in chunks %v, want [1 1 1]", spy.chunks)
	}
	if n := len(w.entries(audit.EventRevoke)); n != 3 {
		t.Fatalf("%d revoke entries, want 3", n)
	}
}
