package audit

import (
	"errors"
	"fmt"
)

// Sentinel errors. The gateway turns every Append error into a denial (fail
// closed): no grant is returned unless its entry is durable.
var (
	// ErrInvalidEntry is returned by Append and Encode for an entry that
	// cannot be recorded as given (unknown kind, zero time, control
	// characters in an identifier, invalid UTF-8, too large). It is a bug
	// in the caller; the request must be denied.
	ErrInvalidEntry = errors.New("invalid audit entry")

	// ErrKeyMaterial is returned by Append and Encode when a field of the
	// entry looks like key material (nvmegate.LooksLikeKeyMaterial: a
	// DH-HMAC-CHAP secret, an NVMe TLS PSK, a PEM private key). Nothing is written and the error never repeats
	// the value. It is a bug in the caller, which must deny the request and
	// treat the secret as exposed in its own memory only.
	ErrKeyMaterial = errors.New("audit entry contains key material")

	// ErrMalformedEntry is returned by DecodeEntry for bytes that are not
	// a canonical entry of a known schema version.
	ErrMalformedEntry = errors.New("malformed audit entry")

	// ErrClosed is returned by every method called after Close, and by an
	// Append still queued when Close ran.
	ErrClosed = errors.New("audit log is closed")

	// ErrUnavailable wraps the cause when the log could not make an append
	// durable (disk full, I/O error, read-only file system). The append may
	// or may not be in the log; the caller must act as if it were not
	// (deny) and must not assume it is absent. The log reloads its state
	// from disk after such a failure and keeps accepting appends; if even
	// that fails it refuses every later append with ErrFailed.
	ErrUnavailable = errors.New("audit log unavailable")

	// ErrFailed is returned by every Append after the log could not reload
	// its state from disk following a write failure. Restart the process
	// (Open runs the recovery again) once the cause is fixed.
	ErrFailed = errors.New("audit log failed and must be reopened")

	// ErrLocked is returned by Open when another process holds the file.
	ErrLocked = errors.New("audit log file is locked by another process")

	// ErrNotAuditLog is returned by Open for a bbolt file that is not an
	// audit log (the inventory store, the key store).
	ErrNotAuditLog = errors.New("file is not an nvmegate audit log")

	// ErrSchemaTooNew is returned by Open for a file written by a newer
	// nvmegate.
	ErrSchemaTooNew = errors.New("audit log schema version is newer than this binary supports")

	// ErrNoSigner is returned by Checkpoint when the log was opened without
	// Options.Signer.
	ErrNoSigner = errors.New("audit log has no signer")

	// ErrNoCheckpoint is returned by Export for a tree size no stored
	// checkpoint has, and by LatestCheckpoint before the first one.
	ErrNoCheckpoint = errors.New("no checkpoint for that tree size")

	// ErrTreeSize is returned by the proof methods for indexes or sizes
	// beyond the committed tree.
	ErrTreeSize = errors.New("index or tree size out of range")

	// ErrCorrupt is returned by Open, Checkpoint and the proofs when the
	// stored state contradicts itself (tree state, nodes, entries or signed
	// checkpoints). The log refuses to sign over it; run Check for the
	// details and restore from an export.
	ErrCorrupt = errors.New("audit log is corrupt")
)

// InconsistentError is returned by Checkpoint when the tree to be signed is
// not an extension of the last signed checkpoint: signing it would fork the
// log. It carries the evidence.
type InconsistentError struct {
	OldSize, NewSize uint64
	OldRoot, NewRoot [32]byte
	Err              error // the proof verification failure
}

func (e *InconsistentError) Error() string {
	return fmt.Sprintf("audit log: tree of size %d (root %x) is not consistent with signed checkpoint of size %d (root %x): %v",
		e.NewSize, e.NewRoot[:8], e.OldSize, e.OldRoot[:8], e.Err)
}

func (e *InconsistentError) Unwrap() error { return ErrCorrupt }

// ErrInvalidQuery is returned by Query for a negative page size or a page
// token it did not make.
var ErrInvalidQuery = errors.New("invalid audit query")
