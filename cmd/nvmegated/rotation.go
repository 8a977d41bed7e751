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
	if m.repl == nil || m.db == nil {
		return nil
	}
	return m.db.NoteRootRotated(context.WithoutCancel(ctx), store.RootRotation{Scope: ev.Name, Version: ev.Version, Fingerprint: ev.Fingerprint, At: ev.Time})
}
