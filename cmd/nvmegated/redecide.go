package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/store"
)

// redecider keeps decisions true: after every policy revision and every
// change to the inventory, host bindings or jobs it has the gateway decide
// again the active grants the change can affect (gateway.Server.Redecide),
// which revokes those no longer allowed and requires a renewal of those
// under stronger obligations.
type redecider struct {
	server *gateway.Server
	feed   *store.ScopeFeed // nil: only policy revisions are followed
	log    *slog.Logger
}

// Run follows the store's scope changes until ctx ends.
func (r *redecider) Run(ctx context.Context) error {
	for {
		c, err := r.feed.Next(ctx)
		if err != nil {
			return nil
		}
		r.redecide(ctx, gateway.Change{Cause: describeChange(c), Targets: c.Targets, Subsystems: c.Subsystems, Nodes: c.Bindings, Jobs: c.Jobs})
	}
}

// policyLoaded re-decides every active grant under a new revision.
func (r *redecider) policyLoaded(ctx context.Context, revision, digest string) {
	r.redecide(ctx, gateway.Change{All: true, Cause: fmt.Sprintf("policy revision %s (digest %s) loaded", revision, digest)})
}

// maxRetries bounds the retries of a re-decision that failed before it
// acted (the store or a policy evaluation unavailable).
const maxRetries = 3

// maxLogged bounds the grants a re-decision names in the log one by one.
const maxLogged = 20

func (r *redecider) redecide(ctx context.Context, c gateway.Change) {
	d, err := r.server.Redecide(ctx, c, nil, false)
	for try := 1; err != nil && d == nil && try <= maxRetries && ctx.Err() == nil; try++ {
		r.log.Warn("grants not re-decided after a change; retrying", "cause", c.Cause, "try", try, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(try) * 2 * time.Second):
		}
		d, err = r.server.Redecide(ctx, c, nil, false)
	}
	if err != nil {
		r.log.Error("grants not (all) re-decided after a change; the next policy load or restart re-decides them all", "cause", c.Cause, "err", err)
		if d == nil {
			return
		}
	}
	// What was done, not what was found: a grant that ended or renewed
	// meanwhile, or a revocation that did not happen, is not named.
	done := map[string]string{}
	for _, id := range d.Done.Revoked {
		done[id] = "revoked: no longer allowed"
	}
	for _, id := range d.Done.Marked {
		done[id] = "must renew: obligations tightened"
	}
	n := 0
	for _, v := range append(d.Ending, d.Tightening...) {
		what, ok := done[v.Grant.ID]
		if !ok {
			continue
		}
		if n++; n > maxLogged {
			r.log.Warn("more grants revoked or obliged to renew by the change", "cause", c.Cause, "not_listed", len(done)-maxLogged)
			break
		}
		r.log.Warn("grant "+what, "cause", c.Cause, "grant", v.Grant.ID, "job", v.Grant.JobID, "node", v.Grant.Node,
			"subsystem", v.Grant.SubsystemNQN, "policy_revision", v.Decision.PolicyRevision, "reasons", strings.Join(v.Reasons(), "; "))
	}
}

// describeChange names a scope change for the log and the entries.
func describeChange(c store.ScopeChange) string {
	var parts []string
	add := func(what string, keys []string) {
		if len(keys) == 0 {
			return
		}
		if len(keys) > 3 {
			keys = append(keys[:3:3], fmt.Sprintf("and %d more", len(keys)-3))
		}
		parts = append(parts, what+" "+strings.Join(keys, ", "))
	}
	add("target", c.Targets)
	add("subsystem", c.Subsystems)
	add("host binding of", c.Bindings)
	add("job", c.Jobs)
	return fmt.Sprintf("change of %s at data revision %d", strings.Join(parts, "; "), c.Revision)
}

// attestCompliance makes a scheduled compliance attestation and keeps its
// bundle under the state directory's compliance/, named by time.
func (m *Main) attestCompliance(ctx context.Context) {
	a, err := m.server.AttestCompliance(ctx)
	if err != nil {
		m.log.Error("compliance attestation not made; retrying at the next interval", "err", err)
		return
	}
	dir := filepath.Join(m.Config.StateDir, "compliance")
	b, err := json.MarshalIndent(a.Bundle, "", "  ")
	if err == nil {
		err = os.MkdirAll(dir, 0o750)
	}
	name := filepath.Join(dir, a.Predicate.Time.Format("20060102T150405Z")+".json")
	if err == nil {
		err = os.WriteFile(name, b, 0o640)
	}
	if err == nil {
		pruneBundles(dir, keptBundles, m.log)
	}
	if err != nil {
		m.log.Error("compliance attestation made and recorded, but not kept on disk", "index", a.Bundle.Index, "err", err)
		return
	}
	level := slog.LevelInfo
	if len(a.Predicate.OutOfCompliance) > 0 {
		level = slog.LevelWarn
	}
	m.log.Log(ctx, level, "compliance attestation signed", "file", name, "index", a.Bundle.Index,
		"out_of_compliance", len(a.Predicate.OutOfCompliance), "policy_revision", a.Predicate.PolicyRevision)
}

// keptBundles is how many scheduled compliance bundles stay on disk (a
// week of hourly ones); older ones are removed (their digests stay in the
// log, and the gateway signs a fresh one on demand).
const keptBundles = 168

// pruneBundles removes all but the newest keep bundles of dir.
func pruneBundles(dir string, keep int, log *slog.Logger) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(names) <= keep {
		return
	}
	slices.Sort(names) // named by time, so oldest first
	for _, n := range names[:len(names)-keep] {
		if err := os.Remove(n); err != nil {
			log.Warn("old compliance bundle not removed", "file", n, "err", err)
		}
	}
}
