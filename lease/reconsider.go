package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/store"
)

// Verdict is an active grant decided again after a change: by the same
// decision a connect of its node would get now.
type Verdict struct {
	Grant    *nvmegate.Grant
	Decision *nvmegate.Decision
	// Shortfalls, for an allowed grant, are the obligations now in force
	// it was not issued under (nvmegate.Grant.Shortfalls): it must renew.
	Shortfalls []string
	// Refusal, if set, is why the grant can no longer be made although
	// policy allowed it (its subsystem can no longer meet the obligations,
	// its records are gone): it is revoked like a denied one.
	Refusal string
}

// Ends reports whether the verdict ends the grant.
func (v Verdict) Ends() bool { return !v.Decision.Allow || v.Refusal != "" }

// Reasons are why the verdict ends or tightens the grant.
func (v Verdict) Reasons() []string {
	switch {
	case v.Refusal != "":
		return []string{v.Refusal}
	case !v.Decision.Allow:
		return v.Decision.Reasons
	}
	return v.Shortfalls
}

// Reconsidered is what Reconsider did.
type Reconsidered struct {
	Revoked []string // grants ended
	Marked  []string // grants that must renew by their ReauthBy
}

// Reconsider acts on verdicts made after a change (cause names it, and
// the store's data revision dataRev, in every entry): a grant no longer
// allowed is revoked — one revoke entry each, with the new decision and
// its reasons — and the roots its host knew rotate; a grant allowed under
// obligations it does not meet is recorded (reauth_required) and must
// renew within the decision's ReauthWithin, or the sweeper revokes it
// (Expire). Grants that meet the new decision are left as they are.
func (l *Lifecycle) Reconsider(ctx context.Context, verdicts []Verdict, cause string, dataRev uint64, caller string) (Reconsidered, error) {
	ctx = context.WithoutCancel(ctx) // begun: ending access runs to its end
	now := l.now()
	var (
		out     Reconsidered
		ends    []*nvmegate.Grant
		entries []audit.Entry
		marks   []store.ReauthMark
		marked  []audit.Entry
	)
	for _, v := range verdicts {
		// Only a grant still as it was decided: one ended meanwhile, or
		// renewed (a new decision, made after the change), is not the
		// grant this verdict is about.
		cur, err := l.grants.Grant(ctx, v.Grant.ID)
		if err != nil || cur.State != nvmegate.GrantActive || cur.DecisionID != v.Grant.DecisionID {
			continue
		}
		g, d := cur, v.Decision
		ad := &audit.Decision{Allow: d.Allow, ID: d.ID, PolicyRevision: d.PolicyRevision, Reasons: d.Reasons}
		switch {
		case v.Ends():
			e := endEntry(audit.EventRevoke, g, caller, clip(fmt.Sprintf("re-decided after %s (policy revision %s, data revision %d): no longer allowed: %s",
				cause, d.PolicyRevision, dataRev, strings.Join(v.Reasons(), "; "))), now)
			e.Decision = ad
			ends, entries = append(ends, g), append(entries, e)
		case len(v.Shortfalls) > 0:
			by := now.Add(d.Obligations.Reauth())
			why := clip(fmt.Sprintf("%s (policy revision %s, data revision %d): %s", cause, d.PolicyRevision, dataRev, strings.Join(v.Shortfalls, "; ")))
			e := endEntry(audit.EventReauth, g, caller, clip(fmt.Sprintf("must renew by %s, or it is revoked: obligations tightened by %s", by.UTC().Format(time.RFC3339), why)), now)
			e.Decision = ad
			marks = append(marks, store.ReauthMark{GrantID: g.ID, DecisionID: g.DecisionID, By: by, Why: why})
			marked = append(marked, e)
		}
	}
	var errs []error
	if len(ends) > 0 {
		done, err := l.revokeRecorded(ctx, ends, entries, "re-decided after "+cause)
		out.Revoked = done
		errs = append(errs, err)
	}
	if len(marks) > 0 {
		// On the record before the deadline is set: a mark whose entry
		// is not durable is not made (the next change, or the next
		// re-decision, tries again).
		for i, e := range marked {
			if _, _, err := l.audit.Append(ctx, e); err != nil {
				errs = append(errs, fmt.Errorf("reauth of grant %s not recorded; not required: %w", marks[i].GrantID, err))
				marks[i].GrantID = ""
			}
		}
		keep := marks[:0]
		for _, m := range marks {
			if m.GrantID != "" {
				keep = append(keep, m)
			}
		}
		gs, err := l.grants.RequireReauth(ctx, keep)
		errs = append(errs, err)
		out.Marked = ids(gs)
	}
	return out, errors.Join(errs...)
}

// clip bounds a detail: reasons lists can be long, and the log bounds its
// fields.
func clip(s string) string {
	const max = 2048
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
