package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

// policySource loads the configured policy: a directory (re-read on every
// check), a bundle file, or the embedded default.
type policySource struct {
	dir, bundle string
}

func (p policySource) name() string {
	switch {
	case p.dir != "":
		return p.dir
	case p.bundle != "":
		return p.bundle
	}
	return authz.SourceEmbedded
}

func (p policySource) load() (*policy.Bundle, error) {
	switch {
	case p.dir != "":
		return policy.LoadDir(p.dir)
	case p.bundle != "":
		return policy.LoadBundleFile(p.bundle)
	}
	return policy.Load(policy.Default())
}

// policyReloader is the hot-reload task: every interval it loads the policy
// again and, when the revision changed, hands it to the engine, which
// prepares and self-tests it before swapping it in. A refused policy is
// logged and the serving one stays.
type policyReloader struct {
	engine   *authz.Engine
	source   policySource
	interval time.Duration
	log      *slog.Logger
	audit    *audit.Log // new and refused revisions are recorded here
	self     string     // the gateway's SPIFFE ID, the caller of its entries
	// refused remembers the last refused digest (or load error) so that it
	// is logged once, not at every tick.
	refused string
	// loaded, if set, hears of every revision swapped in (the grants are
	// re-decided under it).
	loaded func(ctx context.Context, revision, digest string)
}

// Run checks every interval until ctx ends.
func (r *policyReloader) Run(ctx context.Context) error {
	every(ctx, r.interval, func() { r.check(ctx) })
	return nil
}

// check loads the policy once and swaps it in if it is new and good. It
// returns whether a new revision is now serving.
func (r *policyReloader) check(ctx context.Context) bool {
	b, err := r.source.load()
	if err != nil {
		if key := "load:" + err.Error(); key != r.refused {
			r.refused = key
			r.record(ctx, authz.Status{Source: r.source.name()}, err)
			r.log.Warn("policy refused: it does not load; the serving policy stays",
				"source", r.source.name(), "serving_revision", r.engine.Status().Revision, "err", err)
		}
		return false
	}
	// Compare content digests, not revisions: a bundle's .manifest may keep
	// its revision while its files change.
	if b.Digest == r.engine.Status().Digest || b.Digest == r.refused {
		return false
	}
	cand := authz.Status{Revision: b.Revision, Digest: b.Digest, Source: r.source.name()}
	// On the record before it can decide anything: if the log cannot take
	// the entry, the new policy is not loaded (and tried again next tick).
	if r.audit != nil {
		if err := appendPolicyEntry(ctx, r.audit, r.self, fmt.Sprintf("policy revision %s (digest %s) from %s: loading", cand.Revision, cand.Digest, cand.Source)); err != nil {
			r.log.Error("policy not loaded: the audit log did not take its entry", "revision", b.Revision, "err", err)
			return false
		}
	}
	if err := r.engine.Reload(ctx, b, r.source.name()); err != nil {
		// The engine has logged why; remember the digest so that it is
		// not compiled and logged again at every tick.
		r.refused = b.Digest
		r.record(ctx, cand, err)
		return false
	}
	r.refused = ""
	st := r.engine.Status()
	r.record(ctx, st, nil)
	if r.loaded != nil {
		r.loaded(ctx, st.Revision, st.Digest)
	}
	return true
}

// record appends a policy_load entry; a failure is logged (the reload has
// happened or not whatever the log says, and the next decision's entries
// name the revision that made them).
func (r *policyReloader) record(ctx context.Context, st authz.Status, refusal error) {
	if r.audit == nil {
		return
	}
	if err := recordPolicyLoad(ctx, r.audit, r.self, st, refusal); err != nil {
		r.log.Error("policy load not recorded in the audit log", "revision", st.Revision, "err", err)
	}
}

// recordPolicyLoad appends the policy_load entry of a revision that now
// serves (refusal nil) or was refused (refusal says why).
func recordPolicyLoad(ctx context.Context, log *audit.Log, self string, st authz.Status, refusal error) error {
	detail := fmt.Sprintf("policy revision %s (digest %s) from %s serving", st.Revision, st.Digest, st.Source)
	if refusal != nil {
		detail = fmt.Sprintf("policy from %s refused, the serving revision stays: %v", st.Source, refusal)
	}
	return appendPolicyEntry(ctx, log, self, detail)
}

func appendPolicyEntry(ctx context.Context, log *audit.Log, self, detail string) error {
	if len(detail) > 1024 { // compile errors can be long; the log bounds fields
		detail = strings.ToValidUTF8(detail[:1024], "") + "…"
	}
	_, _, err := log.Append(ctx, audit.Entry{Kind: audit.EventPolicyLoad, Caller: self, Detail: detail})
	return err
}
