package main

import (
	"context"
	"log/slog"
	"time"

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
	// refused remembers the last refused digest (or load error) so that it
	// is logged once, not at every tick.
	refused string
}

// Run checks every interval until ctx ends.
func (r *policyReloader) Run(ctx context.Context) error {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.check(ctx)
		}
	}
}

// check loads the policy once and swaps it in if it is new and good. It
// returns whether a new revision is now serving.
func (r *policyReloader) check(ctx context.Context) bool {
	b, err := r.source.load()
	if err != nil {
		if key := "load:" + err.Error(); key != r.refused {
			r.refused = key
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
	if err := r.engine.Reload(ctx, b, r.source.name()); err != nil {
		// The engine has logged why; remember the digest so that it is
		// not compiled and logged again at every tick.
		r.refused = b.Digest
		return false
	}
	r.refused = ""
	return true
}
