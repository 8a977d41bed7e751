package nvmegate

import (
	"regexp"
	"time"
)

// Grant states.
const (
	GrantActive   = "active"
	GrantReleased = "released"
	GrantRevoked  = "revoked"
	GrantExpired  = "expired"
)

// Grant is a lease that lets one host (by NQN) reach one subsystem for one job
// until it expires. It records credential versions, never credentials.
type Grant struct {
	ID           string // random, unguessable
	JobID        string // the job it serves
	Tenant       string // the job's tenant
	Node         string // SPIFFE ID of the node it was issued to
	HostNQN      string // the node's bound host NQN
	SubsystemNQN string // the subsystem it opens
	KeyVersion   uint64 // version of the credential root (KeyScope)
	// KeyScope names the credential root the grant's secrets derive from
	// and the scope they are derived for: the subsystem NQN, or for an
	// nvmet target "target:<id>" (nvmet keys a host once per target, not
	// per subsystem). Empty in records from before it existed: the
	// subsystem NQN.
	KeyScope   string
	IssuedAt   time.Time //
	ExpiresAt  time.Time // never after the job's expiry or the policy's max TTL
	State      string    // Grant* state
	DecisionID string    // the policy decision that allowed it
	AuditIndex uint64    // index of its durable audit entry

	// How its credentials are made and the target programmed (from the
	// decision's obligations), so that every gateway derives the same.
	DHCHAPHash    string // "sha256", "sha384", "sha512"
	DHGroup       string // "null", "ffdhe2048" … "ffdhe8192"
	Bidirectional bool   // a controller secret too
	TLS           bool   // a TLS PSK too
	ReadOnly      bool   // every namespace read-only for this host
}

// Scope is KeyScope, or the subsystem NQN for older records.
func (g *Grant) Scope() string {
	if g.KeyScope != "" {
		return g.KeyScope
	}
	return g.SubsystemNQN
}

// CredentialScope is the key scope of grants on subsystem sub of target t:
// per target for nvmet (one host entry, one key, per target), per
// subsystem otherwise.
func CredentialScope(t *Target, sub *Subsystem) string {
	if t.Driver == DriverNVMet {
		return "target:" + t.ID
	}
	return sub.NQN
}

// Active reports whether the grant is active at time now.
func (g *Grant) Active(now time.Time) bool {
	return g.State == GrantActive && now.Before(g.ExpiresAt)
}

var grantIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{8,64}$`)

// ValidateGrantID checks the shape of a grant ID (8-64 characters of
// A-Z, a-z, 0-9, '_' and '-').
func ValidateGrantID(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !grantIDRE.MatchString(v) {
		return Invalid(field, "must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-' (got %s)", show(v))
	}
	return nil
}
