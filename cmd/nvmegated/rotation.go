package main

import (
	"context"

	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// noteRotated notes an access root rotation this replica made in the store
// of the replicas (keys.Options.OnRotated): every replica drops the old
// root as it applies the change. A lone gateway's cache is its own.
func (m *Main) noteRotated(ctx context.Context, ev keys.RotationEvent) error {
	if m.repl == nil || m.db == nil || !m.allApply(ctx) {
		return nil // the others read it at their next refresh
	}
	return m.db.NoteRootRotated(context.WithoutCancel(ctx), store.RootRotation{Scope: ev.Name, Version: ev.Version, Fingerprint: ev.Fingerprint, At: ev.Time})
}

// reconcileRotations is the leader's, at the start of its term: a rotation
// whose replica died between Vault taking it and the store noting it is
// noted now, so every replica drops the old root before its refresh.
func (m *Main) reconcileRotations(ctx context.Context) {
	if !m.allApply(ctx) {
		return
	}
	noted, err := m.db.NotedRoots(ctx)
	if err != nil {
		m.log.Warn("root rotations not reconciled with the store", "err", err)
		return
	}
	scopes, err := m.keys.Subsystems(ctx)
	if err != nil {
		m.log.Warn("root rotations not reconciled with the store", "err", err)
		return
	}
	for _, scope := range scopes {
		st, err := m.keys.Status(ctx, scope)
		if err != nil || st.Current <= noted[scope] || len(st.Versions) == 0 {
			continue
		}
		v := st.Versions[0] // newest first
		if err := m.db.NoteRootRotated(ctx, store.RootRotation{Scope: scope, Version: v.Version, Fingerprint: v.Fingerprint, At: v.Created}); err != nil {
			m.log.Warn("root rotation not noted in the store; the replicas read it at their next refresh", "scope", scope, "err", err)
		}
	}
}

// allApply says whether every live replica applies the records this
// version added (policy, root notes); a failure to tell is a no.
func (m *Main) allApply(ctx context.Context) bool {
	ok, err := m.repl.allApply(ctx, recordsNow)
	if err != nil {
		m.log.Warn("cannot tell whether every replica is upgraded", "err", err)
	}
	return ok
}
