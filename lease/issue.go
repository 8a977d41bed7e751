package lease

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// Issue grants the scope's caller its subsystem for its job: the grant
// meets the decision's obligations, its credentials derive for the
// caller's bound host NQN from the current root, its entry is durable
// before the store or the target changes, and the target allows the host
// with those credentials before Issue returns. The node's grants sharing
// its host entry move with it. Any failure after the entry ends the
// grant, puts the moved grants back and is recorded: nothing is returned
// that the target does not hold. The node's earlier grant on the
// subsystem in the job ends (released, superseded) in the new grant's
// commit — no answer finds both active — and comes back if the target
// refuses the new one: a connect that fails leaves the node the grant it
// had.
func (l *Lifecycle) Issue(ctx context.Context, r Request) (Issued, error) {
	j, sub, t, err := records(r)
	if err != nil {
		return Issued{}, err
	}
	sc, d := r.Scope, r.Decision
	now := l.now()
	g := &nvmegate.Grant{ID: newGrantID(), JobID: j.ID, Tenant: j.Tenant, Node: sc.Caller,
		HostNQN: sc.Binding.HostNQN, SubsystemNQN: sub.NQN, IssuedAt: now,
		ExpiresAt: nvmegate.GrantExpiry(now, r.TTL, d.Obligations.MaxTTL, j.ExpiresAt), State: nvmegate.GrantActive,
		DecisionID: d.ID, KeyScope: nvmegate.CredentialScope(t, sub)}
	if err := g.ApplyObligations(sub, t, d.Obligations); err != nil {
		return Issued{}, err
	}
	// One grant per node, job and subsystem: a new connect supersedes the
	// node's earlier grant (its credentials are replaced on the target)
	// once it is granted. The node's grants that share this host entry:
	// g asks for the strongest authentication among them, and they move
	// with it.
	superseded, sharing, err := l.nodeGrants(ctx, g)
	if err != nil {
		return Issued{}, err
	}
	creds, err := l.credentials(ctx, g)
	if err != nil {
		return Issued{}, err
	}
	g.KeyVersion = creds.RootVersion
	moving := differing(sharing, g)
	// Every host entry the commit changes: g's, those it supersedes (on
	// the same subsystem, or another host NQN if the node's binding
	// changed), those that move with it (its host on the target's other
	// subsystems).
	touched := append(append([]*nvmegate.Grant{g}, superseded...), moving...)
	res := l.run(ctx, &change{
		op:      "connect",
		grant:   g,
		entry:   grantEntry(audit.EventGrant, actionConnect, sc, d, g, creds, superseded, moving, now),
		opening: openingEntry(audit.EventGrant, actionConnect, sc, d, g, creds, moving, now),
		check: func() (string, error) {
			// Finished between the policy decision and now.
			if j.State != nvmegate.JobActive {
				return "job " + j.ID + " is " + j.State, nvmegate.Errorf(nvmegate.ECONFLICT, "job %s is %s; no grant", j.ID, j.State)
			}
			return "", nil
		},
		// The node's binding removed, changed or added while it
		// connected: the commit refuses the grant.
		binding:      &store.BindingAt{Bound: sc.Bound, Binding: sc.Binding},
		moving:       moving,
		supersede:    true,
		storeFailure: "grant not stored",
		deny:         denyEntry(actionConnect, sc, d, g),
		refused:      "target " + t.ID + " did not accept the host",
		refusal:      nvmegate.Errorf(nvmegate.EUNAVAILABLE, "target %s did not accept the host in time; no grant was made", t.ID),
		target:       t.ID,
		hosts:        nvmegate.HostRefs(touched...),
	})
	if res.err != nil {
		return Issued{}, res.err
	}
	return Issued{Grant: g, Credentials: creds}, nil
}

// Renew extends g (within policy's caps and the job's expiry) and returns
// its current credentials: after a rotation, the new root's, with the
// target reprogrammed before Renew returns. The renewal is a new decision:
// its obligations apply in full (a class now obliging a stronger hash, a
// DH group, bidirectional authentication, TLS or read-only changes the
// grant and its credentials, as a connect would). The caller has checked
// that g is the node's own and active. If the target does not take the
// new keys, g keeps its old ones (and so do the grants that would have
// moved with it).
func (l *Lifecycle) Renew(ctx context.Context, g *nvmegate.Grant, r Request) (Issued, error) {
	j, sub, t, err := records(r)
	if err != nil {
		return Issued{}, err
	}
	sc, d := r.Scope, r.Decision
	prev := *g
	if err := g.ApplyObligations(sub, t, d.Obligations); err != nil {
		return Issued{}, err
	}
	_, sharing, err := l.nodeGrants(ctx, g)
	if err != nil {
		return Issued{}, err
	}
	creds, err := l.credentials(ctx, g)
	if err != nil {
		return Issued{}, err
	}
	now := l.now()
	g.KeyVersion, g.ExpiresAt, g.DecisionID = creds.RootVersion, nvmegate.GrantExpiry(now, r.TTL, d.Obligations.MaxTTL, j.ExpiresAt), d.ID
	// Renewed under the obligations in force: no renewal deadline.
	g.ReauthBy, g.ReauthWhy = time.Time{}, ""
	// The node's grants that share this host entry move with it.
	moving := differing(sharing, g)
	var hosts []nvmegate.HostRef // none: the target holds nothing that changed
	if len(moving) > 0 || g.HostEntry() != prev.HostEntry() || g.TLS != prev.TLS || g.ReadOnly != prev.ReadOnly {
		hosts = nvmegate.HostRefs(append([]*nvmegate.Grant{g}, moving...)...)
	}
	// If the target refuses, g goes back as it was: weaker than the
	// obligations in force, so it must renew within their reauth_within,
	// as a re-decision would have required (one made while this renewal
	// ran skipped it: its decision was changing).
	undo := prev
	if short, err := prev.Shortfalls(sub, t, d.Obligations, now); err == nil && len(short) > 0 && undo.ReauthBy.IsZero() {
		undo.ReauthBy = now.Add(d.Obligations.Reauth())
		undo.ReauthWhy = "its renewal under obligations it does not meet (" + strings.Join(short, "; ") + ") was refused by target " + t.ID
	}
	res := l.run(ctx, &change{
		op:      "renew",
		grant:   g,
		entry:   grantEntry(audit.EventRenew, actionRenew, sc, d, g, creds, nil, moving, now),
		opening: openingEntry(audit.EventRenew, actionRenew, sc, d, g, creds, moving, now),
		moving:  moving,
		undo:    &undo,
		deny:    denyEntry(actionRenew, sc, d, g),
		refused: "target " + t.ID + " did not accept the new keys",
		refusal: nvmegate.Errorf(nvmegate.EUNAVAILABLE, "target %s did not accept the new keys; the grant keeps its old ones", t.ID),
		target:  t.ID,
		hosts:   hosts,
	})
	if res.err != nil {
		return Issued{}, res.err
	}
	return Issued{Grant: g, Credentials: creds}, nil
}

// records are the job, subsystem and target of a node's call, as its
// scope read them.
func records(r Request) (*nvmegate.Job, *nvmegate.Subsystem, *nvmegate.Target, error) {
	sc := r.Scope
	switch {
	case sc == nil || r.Decision == nil:
		return nil, nil, nil, nvmegate.Errorf(nvmegate.EINTERNAL, "lease: a request needs its scope and decision")
	case sc.Job == nil:
		return nil, nil, nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "job %q not found", sc.JobID)
	case sc.Subsystem == nil:
		return nil, nil, nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "subsystem %q not found", sc.SubsystemNQN)
	case sc.Target == nil:
		return nil, nil, nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "target %q not found", sc.Subsystem.TargetID)
	}
	return sc.Job, sc.Subsystem, sc.Target, nil
}

// nodeGrants reads the node's active grants once and returns those g
// supersedes (same job and subsystem) and those that share g's host entry
// (nvmegate.Grant.SharesHostEntry), in any job, whose root is still usable
// (one past its grace was cut off and stays so). g joins each sharing
// grant's authentication (nvmegate.Grant.JoinHostEntry): the target holds
// one set of credentials for them, and they move with g to its root
// version and authentication.
func (l *Lifecycle) nodeGrants(ctx context.Context, g *nvmegate.Grant) (superseded, sharing []*nvmegate.Grant, err error) {
	all, err := l.grants.NodeActiveGrants(ctx, g.Node)
	if err != nil {
		return nil, nil, err
	}
	now := l.now()
	for _, o := range all {
		switch {
		case o.ID == g.ID:
			continue
		case o.JobID == g.JobID && o.SubsystemNQN == g.SubsystemNQN:
			superseded = append(superseded, o)
			continue
		case !o.Active(now) || !g.SharesHostEntry(o):
			continue
		}
		if err := l.keys.Usable(ctx, g.Scope(), o.KeyVersion); errors.Is(err, keys.ErrExpired) {
			continue
		} else if err != nil {
			return nil, nil, keyErr(err)
		}
		if err := g.JoinHostEntry(o); err != nil {
			return nil, nil, err
		}
		sharing = append(sharing, o)
	}
	return superseded, sharing, nil
}

// credentials derives g's credentials from the current root of its scope.
func (l *Lifecycle) credentials(ctx context.Context, g *nvmegate.Grant) (keys.Credentials, error) {
	p, err := keys.ParamsFor(g.DHCHAPHash, g.Bidirectional, g.TLS)
	if err != nil {
		return keys.Credentials{}, err
	}
	c, err := l.keys.Credentials(ctx, g.HostNQN, g.Scope(), p)
	if err != nil {
		return keys.Credentials{}, keyErr(err)
	}
	return c, nil
}

// differing returns the grants whose host entry (root version and
// authentication) is not g's: those a change of g moves.
func differing(gs []*nvmegate.Grant, g *nvmegate.Grant) []*nvmegate.Grant {
	var out []*nvmegate.Grant
	for _, o := range gs {
		if o.HostEntry() != g.HostEntry() {
			out = append(out, o)
		}
	}
	return out
}

func newGrantID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "g-" + base64.RawURLEncoding.EncodeToString(b)
}
