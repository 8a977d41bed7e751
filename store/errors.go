package store

import "errors"

// Sentinel errors of Open and of a closed DB. Record-level failures (missing
// records, conflicts, broken cross-record rules) are *nvmegate.Error values
// instead, so that the gateway maps them to status codes; these sentinels are
// operational failures that the daemon reports and exits on.
var (
	// ErrLocked is returned by Open when another process (or another DB in
	// this process) holds the file and the lock was not released within
	// Options.Timeout. Stop the other nvmegated or point this one at its own
	// file.
	ErrLocked = errors.New("database file is locked by another process")

	// ErrSchemaTooNew is returned by Open when the file was written by a
	// newer nvmegate whose schema this binary does not know. Run the newer
	// binary (or restore a backup); this one refuses rather than misread it.
	ErrSchemaTooNew = errors.New("schema version is newer than this binary supports")

	// ErrNotStore is returned by Open when the file is a bbolt database that
	// is not an nvmegate store (for example the audit log or the local key
	// store). Nothing is written to it; check the configured path.
	ErrNotStore = errors.New("file is not an nvmegate store")

	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("store is closed")
)
