package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
	"github.com/nvmegate/nvmegate/store"
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
	// shared, for replicas, is the store the policy in force is a record
	// of: the leader's reloader makes its source's policy the one in force
	// there (a change of the log), and every replica's engine swaps to it
	// as it applies that change (Main.policyLoaded), not to its own files.
	shared *store.DB
	// sharedOK, with shared, says whether every replica applies policy
	// records (a rolling upgrade: until then each decides under its own
	// source, as before).
	sharedOK func(context.Context) bool
}

// Run checks every interval until ctx ends.
func (r *policyReloader) Run(ctx context.Context) error {
	if r.shared != nil {
		r.check(ctx) // a new leader's source may hold a policy not yet in force
	}
	every(ctx, r.interval, func() { r.check(ctx) })
	return nil
}

// check loads the policy once and swaps it in if it is new and good. It
// returns whether a new revision is now serving.
func (r *policyReloader) check(ctx context.Context) bool {
	if r.shared != nil {
		return r.checkShared(ctx)
	}
	b, ok := r.loadSource(ctx)
	if !ok {
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

// checkShared is check on the leader of replicas: a new policy of its
// source, once compiled and self-tested here, becomes the one in force by
// a change of the store, with its policy_load entry in the same commit;
// each replica, this one included, swaps to it as it applies the change.
// A refused policy is recorded once, and the one in force stays.
func (r *policyReloader) checkShared(ctx context.Context) bool {
	b, ok := r.loadSource(ctx)
	if !ok {
		return false
	}
	if cur := r.shared.Policy(); cur != nil && cur.Digest == b.Digest || b.Digest == r.refused {
		return false
	}
	if r.sharedOK != nil && !r.sharedOK(ctx) {
		if r.refused != "older replicas" {
			r.refused = "older replicas"
			r.log.Warn("policy not made the one in force for every replica: a replica of an older version runs (each decides under its own source until all are upgraded)", "revision", b.Revision)
		}
		return false
	}
	src := r.source.name()
	cand := authz.Status{Revision: b.Revision, Digest: b.Digest, Source: src}
	if err := r.engine.Check(ctx, b, src); err != nil {
		r.refused = b.Digest
		r.record(ctx, cand, err)
		r.log.Warn("policy refused: the one in force stays on every replica", "revision", b.Revision, "source", src, "err", err)
		return false
	}
	entry := audit.Entry{Kind: audit.EventPolicyLoad, Caller: r.self,
		Detail: clipDetail(fmt.Sprintf("policy revision %s (digest %s) from %s in force on every replica from this change", b.Revision, b.Digest, src))}
	loaded, err := r.shared.LoadPolicy(ctx, &store.Policy{Revision: b.Revision, Digest: b.Digest, Source: src, Files: b.Files()}, entry)
	if err != nil {
		r.log.Error("policy not made the one in force (the store did not take it); retrying", "revision", b.Revision, "err", err)
		return false
	}
	r.refused = ""
	if loaded && r.loaded != nil {
		r.loaded(ctx, b.Revision, b.Digest)
	}
	return loaded
}

// loadSource loads the source's bundle; a failure is recorded and logged
// once.
func (r *policyReloader) loadSource(ctx context.Context) (*policy.Bundle, bool) {
	b, err := r.source.load()
	if err != nil {
		if key := "load:" + err.Error(); key != r.refused {
			r.refused = key
			r.record(ctx, authz.Status{Source: r.source.name()}, err)
			r.log.Warn("policy refused: it does not load; the serving policy stays",
				"source", r.source.name(), "serving_revision", r.engine.Status().Revision, "err", err)
		}
		return nil, false
	}
	return b, true
}

// bundleOf is the store's policy as a bundle, checked to be the one its
// digest names.
func bundleOf(p *store.Policy) (*policy.Bundle, error) {
	b, err := policy.LoadFiles(p.Files)
	if err != nil {
		return nil, err
	}
	if b.Digest != p.Digest {
		return nil, fmt.Errorf("the policy record names digest %s, its files hash to %s", p.Digest, b.Digest)
	}
	return b, nil
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
	_, _, err := log.Append(ctx, audit.Entry{Kind: audit.EventPolicyLoad, Caller: self, Detail: clipDetail(detail)})
	return err
}

// startingRecord makes a replica's first record at start, again while the
// log answers Unavailable, a few times: a replica that starts while none
// leads appends on its own, and can lose its compare to the replica
// elected meanwhile until it gives up (seen once in the failover test:
// "commit of 75 entries …: the replicated log moved on", and the replica
// exited). Nothing was appended; the next attempt is forwarded to that
// leader. A lone gateway's record is tried once.
func (m *Main) startingRecord(ctx context.Context, record func() error) error {
	err := record()
	for wait := 200 * time.Millisecond; err != nil && m.repl != nil && errors.Is(err, audit.ErrUnavailable) && wait <= 3200*time.Millisecond; wait *= 2 {
		m.log.Warn("the record of this replica's start did not reach the log; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		err = record()
	}
	return err
}

// clipDetail bounds an entry's detail: compile errors can be long, and
// the log bounds fields.
func clipDetail(detail string) string {
	if len(detail) > 1024 {
		return strings.ToValidUTF8(detail[:1024], "") + "…"
	}
	return detail
}

// startingPolicy is the bundle a replica starts deciding under: the policy
// in force in the store, if one was loaded through it, else its source's
// (a lone gateway's always).
func (m *Main) startingPolicy(src policySource) (*policy.Bundle, string, error) {
	if m.repl != nil {
		if p := m.db.Policy(); p != nil {
			b, err := bundleOf(p)
			return b, p.Source, err
		}
	}
	b, err := src.load()
	return b, src.name(), err
}

// policyLoaded swaps this replica's engine to the policy a change of the
// store made the one in force (store.Options.PolicyLoaded): on every
// replica, as its projection applies the change, before any call that
// passes the read barrier after it. A policy this replica cannot load
// holds its engine: it decides nothing until one loads.
func (m *Main) policyLoaded(p *store.Policy) {
	e := m.policyEngine.Load()
	if e == nil || e.Status().Digest == p.Digest {
		return // the engine is made from the store's policy (startingPolicy)
	}
	b, err := bundleOf(p)
	if err == nil {
		err = e.Reload(context.Background(), b, p.Source)
	}
	if err != nil {
		// Not the one before: the others decide under this one. Fail
		// closed until a policy in force loads here.
		e.Hold(fmt.Errorf("policy revision %s (digest %s): %w", p.Revision, p.Digest, err))
		m.log.Error("the policy in force could not be loaded on this replica; it decides nothing until one loads", "revision", p.Revision, "digest", p.Digest, "err", err)
		return
	}
	m.log.Info("policy in force loaded", "revision", p.Revision, "digest", p.Digest, "source", p.Source)
}
