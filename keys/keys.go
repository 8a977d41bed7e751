package keys

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Errors. Backends wrap them; callers test with errors.Is.
var (
	// ErrNotFound: no such key (a namespace without a data key).
	ErrNotFound = errors.New("keys: no such key")
	// ErrConflict: a check-and-set lost to a concurrent writer (another
	// gateway rotated first). Nothing was written.
	ErrConflict = errors.New("keys: key changed concurrently")
	// ErrUnavailable: the key store cannot be reached, or the cached roots
	// are older than the staleness bound. Credentials are not issued.
	ErrUnavailable = errors.New("keys: key store unavailable")
	// ErrExpired: a superseded version past its grace period.
	ErrExpired = errors.New("keys: key version past its grace period")
	// ErrInvalid: a malformed argument (empty name, bad size).
	ErrInvalid = errors.New("keys: invalid argument")
)

// RootSize is the size of an access-credential root.
const RootSize = 32

// Root is one version of a subsystem's access-credential root. It prints
// redacted.
type Root struct {
	Version    uint64    `json:"version"`
	Secret     []byte    `json:"secret"`
	Created    time.Time `json:"created"`
	Superseded time.Time `json:"superseded,omitzero"` // zero for the current version
}

// String redacts the secret.
func (r Root) String() string {
	return fmt.Sprintf("root v%d (created %s, secret redacted)", r.Version, r.Created.UTC().Format(time.RFC3339))
}

// LogValue redacts the secret in slog output.
func (r Root) LogValue() slog.Value { return slog.StringValue(r.String()) }

// GoString redacts the secret for %#v.
func (r Root) GoString() string { return r.String() }

// KEKVersion is one version of a namespace's key-encryption key.
type KEKVersion struct {
	Version uint64
	Created time.Time
}

// Wrapped is a data-encryption key wrapped by its namespace's KEK. The
// ciphertext is the backend's own format ("vault:v3:…", "local:v3:…").
type Wrapped struct {
	KEKVersion uint64 `json:"kek_version"`
	Ciphertext string `json:"ciphertext"`
	// Generation counts the namespace's data keys: 1 for its first, one
	// more for each data-key rotation (re-encryption). Each generation has
	// a KEK of its own, destroyed when the next generation takes over.
	Generation uint64 `json:"generation,omitempty"`
}

// Gen is w's generation (records from before generations are the first).
func (w Wrapped) Gen() uint64 { return max(w.Generation, 1) }

// DataKeyRecord is how backends store a namespace's data key: the current
// one and, while a re-encryption is under way, the next, with the
// namespace record they belong to.
type DataKeyRecord struct {
	Wrapped
	// Owner names the namespace record (its incarnation) the key was made
	// for: a namespace added again under the same name is another record,
	// and must never inherit the key of the one removed before it. ""
	// for keys made before owners were recorded, which only a record
	// without an incarnation (as old) may use.
	Owner string   `json:"owner,omitempty"`
	Next  *Wrapped `json:"next,omitempty"`
}

// Backend stores the hierarchy. Subsystems and namespaces are named by
// strings the caller chooses (the subsystem NQN; "<NQN>/<NSID>").
type Backend interface {
	// Roots returns a subsystem's root versions, oldest first; none (and
	// no error) if it has none yet.
	Roots(ctx context.Context, subsystem string) ([]Root, error)
	// AddRoot makes secret version prev+1 if the current version is still
	// prev (0: none yet), marks prev superseded at now and drops versions
	// superseded before dropBefore, in one check-and-set. It returns the
	// new set, or ErrConflict if the current version is no longer prev.
	AddRoot(ctx context.Context, subsystem string, prev uint64, secret []byte, now, dropBefore time.Time) ([]Root, error)
	// Subsystems lists the subsystems that have roots.
	Subsystems(ctx context.Context) ([]string, error)

	// CreateDataKey generates a namespace's data key for the namespace
	// record owner, wrapped by its KEK (created if needed), and stores it;
	// ErrConflict if one exists.
	CreateDataKey(ctx context.Context, namespace, owner string) (Wrapped, error)
	// DataKey returns the stored record: the wrapped data key, its owner
	// and the next data key of a re-encryption under way (nil if none);
	// ErrNotFound without one. One read serves both keys, so a caller
	// never pairs a current key and a next one from different moments.
	DataKey(ctx context.Context, namespace string) (DataKeyRecord, error)
	// Unwrap returns the data key in w.
	Unwrap(ctx context.Context, namespace string, w Wrapped) ([]byte, error)
	// RotateDataKey rotates the namespace's KEK and rewraps the stored data
	// key under the new version (the data key itself is unchanged).
	RotateDataKey(ctx context.Context, namespace string) (Wrapped, error)
	// KEKVersions lists the namespace KEK's versions, oldest first.
	KEKVersions(ctx context.Context, namespace string) ([]KEKVersion, error)
	// BeginDataKeyRotation makes the namespace's next data key (the
	// generation after the current one, under a KEK of its own) and
	// stores it beside the current one; if one is stored, it returns it.
	BeginDataKeyRotation(ctx context.Context, namespace string) (Wrapped, error)
	// CommitDataKeyRotation makes the next data key, of the given
	// generation, the current one and destroys the previous generation's
	// KEK: the old data key can no longer be unwrapped, from any copy.
	// Committing a generation already current finishes the destruction;
	// any other generation is ErrConflict.
	CommitDataKeyRotation(ctx context.Context, namespace string, generation uint64) (Wrapped, error)
	// DestroyDataKey destroys the namespace's data key and every version
	// of its KEK (crypto-erase): no copy of the wrapped key, a backup's
	// included, can be unwrapped after. ErrNotFound if it has neither.
	DestroyDataKey(ctx context.Context, namespace string) error

	Close() error
}

// NextRoots is the root set after adding secret as the next version at
// now: the previous current version is marked superseded at now, and
// versions superseded before dropBefore are dropped. Backends use it so
// that both compute the same sets.
func NextRoots(roots []Root, secret []byte, now, dropBefore time.Time) []Root {
	out := make([]Root, 0, len(roots)+1)
	var next uint64 = 1
	for i, r := range roots {
		if i == len(roots)-1 {
			r.Superseded = now
			next = r.Version + 1
		}
		if !r.Superseded.IsZero() && r.Superseded.Before(dropBefore) {
			continue
		}
		out = append(out, r)
	}
	return append(out, Root{Version: next, Secret: secret, Created: now})
}

// CheckName is the backends' check of a subsystem or namespace name.
func CheckName(kind, name string) error {
	if name == "" || len(name) > 1024 {
		return fmt.Errorf("%w: %s name must be 1-1024 bytes", ErrInvalid, kind)
	}
	return nil
}
