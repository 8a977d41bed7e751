package lease

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// Grants is the grant store as the lifecycle uses it (*store.DB).
type Grants interface {
	Grant(ctx context.Context, id string) (*nvmegate.Grant, error)
	ListGrants(ctx context.Context, f store.GrantFilter, p store.Page) ([]*nvmegate.Grant, string, error)
	// NodeActiveGrants are a node's active grants in any job, on any
	// subsystem: those a new grant supersedes or shares a host entry with.
	NodeActiveGrants(ctx context.Context, node string) ([]*nvmegate.Grant, error)
	// ActiveGrants are the grants stored as active.
	ActiveGrants(ctx context.Context) ([]*nvmegate.Grant, error)
	// ExpiredGrants are the grants still stored as active past their
	// expiry.
	ExpiredGrants(ctx context.Context) ([]*nvmegate.Grant, error)
	// PutGrantsMoving stores gs and, in the same commit, gives the active
	// grants named in move the host entry to (only those still at *from,
	// if from is set). Ended grants never become active again.
	PutGrantsMoving(ctx context.Context, gs []*nvmegate.Grant, move []string, from *nvmegate.HostEntry, to nvmegate.HostEntry) error
	// PendingRemovals are the ended grants whose targets have not
	// acknowledged removing their hosts; SettleRemovals records that they
	// did.
	PendingRemovals(ctx context.Context) ([]*nvmegate.Grant, error)
	SettleRemovals(ctx context.Context, ids []string) error
	// HostKeyScopes are the key scopes and root versions under which
	// identities held grants on a host NQN, ended ones included.
	HostKeyScopes(ctx context.Context, nqn string) ([]store.HostKeyScope, error)
	// OpenGrant stores an opening g with its moves and, with supersede,
	// ends (released, superseded by g) the node's other active grants in
	// g's job on g's subsystem in the same commit, pending removal where
	// their host is not g's; it returns them. UndoOpening revokes g
	// (pending removal) and puts back what it superseded, unless g ended
	// meanwhile by another's hand or they can no longer be active; it
	// returns those put back (store.DB has the rules).
	OpenGrant(ctx context.Context, g *nvmegate.Grant, move []string, supersede bool, at *store.BindingAt) ([]*nvmegate.Grant, error)
	// Journaled stores sequence their writes in the audit log:
	// OpenGrantRecorded makes the opening's entry (built from what it
	// superseded, as decided in the commit) and the opening durable in
	// one commit, and sets g.AuditIndex.
	Journaled() bool
	// PutGrantsRecorded is PutGrants with the step's entries in the same
	// commit (journaled stores).
	PutGrantsRecorded(ctx context.Context, gs []*nvmegate.Grant, entries []audit.Entry) error
	OpenGrantRecorded(ctx context.Context, g *nvmegate.Grant, move []string, supersede bool, at *store.BindingAt,
		entry store.OpeningEntry) ([]*nvmegate.Grant, error)
	UndoOpening(ctx context.Context, g *nvmegate.Grant) ([]*nvmegate.Grant, error)
	// RequireReauth sets renewal deadlines on the grants still active
	// under the decisions the marks name; it returns those it marked.
	RequireReauth(ctx context.Context, marks []store.ReauthMark) ([]*nvmegate.Grant, error)
}

// Inventory tells where a grant's subsystem is (*store.DB).
type Inventory interface {
	Subsystem(ctx context.Context, nqn string) (*nvmegate.Subsystem, error)
	Target(ctx context.Context, id string) (*nvmegate.Target, error)
}

// Keys derives credentials and rotates what revoked hosts knew
// (*keys.Manager).
type Keys interface {
	// Credentials derives a host's credentials from the current root of
	// scope.
	Credentials(ctx context.Context, hostNQN, scope string, p keys.CredentialParams) (keys.Credentials, error)
	// Usable is nil while root version v of scope may still be used,
	// keys.ErrExpired after its grace.
	Usable(ctx context.Context, scope string, v uint64) error
	// Revoked rotates the root of scope: what the revoked hosts knew stops
	// working after the grace.
	Revoked(ctx context.Context, scope, why string) error
	// Status describes scope's roots (Current is the version new
	// credentials derive from).
	Status(ctx context.Context, scope string) (keys.RootStatus, error)
}

// AuditLog is where every step is recorded before it happens (*audit.Log).
type AuditLog interface {
	Append(ctx context.Context, e audit.Entry) (uint64, [32]byte, error)
}

// Targets programs targets (*targetagent.Agent): Program returns once the
// target allows exactly the hosts its active grants name, as the store
// holds them after the call. changed are the host entries whose grants
// the caller changed.
type Targets interface {
	Program(ctx context.Context, targetID string, changed ...nvmegate.HostRef) error
}

// Config wires a Lifecycle. Every interface is required.
type Config struct {
	Grants    Grants
	Inventory Inventory
	Keys      Keys
	Audit     AuditLog
	Targets   Targets
	// Now is the clock of issue times, expiries and entries; time.Now if
	// nil.
	Now func() time.Time
	// EndChunk caps the grants one commit ends (a revocation of a whole
	// job, a sweep's expiries): each commit, and each write a replica
	// forwards, stays within etcd's request limit (1.5 MiB by default),
	// about 2.5 KB per ended grant with its entry. Zero means
	// DefaultEndChunk.
	EndChunk int
	// Logger hears of what failed where the caller is not told (a
	// compensation, a target that did not follow an end); slog.Default()
	// if nil.
	Logger *slog.Logger
}

// Lifecycle issues, renews, releases, revokes and expires grants. It is
// safe for concurrent use.
type Lifecycle struct {
	grants    Grants
	inventory Inventory
	keys      Keys
	audit     AuditLog
	targets   Targets
	now       func() time.Time
	log       *slog.Logger
	endChunk  int
}

// DefaultEndChunk is Config.EndChunk's default: a job's 10,000 grants end
// in 79 commits.
const DefaultEndChunk = 128

// New returns the Lifecycle cfg wires.
func New(cfg Config) (*Lifecycle, error) {
	if cfg.Grants == nil || cfg.Inventory == nil || cfg.Keys == nil || cfg.Audit == nil || cfg.Targets == nil {
		return nil, errors.New("lease: Grants, Inventory, Keys, Audit and Targets are required")
	}
	l := &Lifecycle{grants: cfg.Grants, inventory: cfg.Inventory, keys: cfg.Keys, audit: cfg.Audit, targets: cfg.Targets,
		now: cfg.Now, log: cfg.Logger, endChunk: cfg.EndChunk}
	if l.endChunk <= 0 {
		l.endChunk = DefaultEndChunk
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.Default()
	}
	return l, nil
}

// Request is a node's connect or renewal as policy allowed it.
type Request struct {
	// Scope is the call's scope as it was read once for policy: the
	// caller and its binding, the job, the subsystem and its target, the
	// namespaces. The grant is made from it and its entries record it.
	Scope *nvmegate.Scope
	// Decision is policy's, with the obligations the grant must meet.
	Decision *nvmegate.Decision
	// TTL is the lifetime asked for; 0 means nvmegate.DefaultGrantTTL.
	// Policy's max TTL and the job's expiry cap it.
	TTL time.Duration
}

// Issued is a grant issued or renewed, with the credentials its node gets:
// the only place they appear (never stored, never recorded, never logged).
type Issued struct {
	Grant       *nvmegate.Grant
	Credentials keys.Credentials
}

// Selection picks the active grants a revocation ends: the one GrantID
// names, or else those of JobID and Node (an empty field matches every
// grant; a Selection must name something).
type Selection struct {
	GrantID string
	JobID   string
	Node    string
}

// Grant returns a grant, or ENOTFOUND; one past its expiry reads as
// expired.
func (l *Lifecycle) Grant(ctx context.Context, id string) (*nvmegate.Grant, error) {
	return l.grants.Grant(ctx, id)
}

// ActiveGrants returns the grants stored as active (a re-decision's
// subjects), by subsystem.
func (l *Lifecycle) ActiveGrants(ctx context.Context) ([]*nvmegate.Grant, error) {
	return l.grants.ActiveGrants(ctx)
}

// ListGrants returns one page of grants.
func (l *Lifecycle) ListGrants(ctx context.Context, f store.GrantFilter, p store.Page) ([]*nvmegate.Grant, string, error) {
	return l.grants.ListGrants(ctx, f, p)
}

// targetOf is the target of a grant's subsystem.
func (l *Lifecycle) targetOf(ctx context.Context, g *nvmegate.Grant) (*nvmegate.Target, error) {
	sub, err := l.inventory.Subsystem(ctx, g.SubsystemNQN)
	if err != nil {
		return nil, err
	}
	return l.inventory.Target(ctx, sub.TargetID)
}
