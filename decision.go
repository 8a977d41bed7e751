package nvmegate

import "time"

// Authentication modes a policy may require of a connection.
const (
	AuthDHCHAP = "dhchap" // DH-HMAC-CHAP in-band authentication
	AuthTLS    = "tls"    // NVMe/TCP TLS with a PSK
	AuthBoth   = "both"   // both (only where the target supports it)
)

// Decision is the policy's answer to one request. A Decision with Allow false
// always carries at least one reason.
type Decision struct {
	ID             string      // unique per evaluation; goes to logs and the audit entry
	Allow          bool        // the request may proceed
	Reasons        []string    // why: deny reasons, or the rules that allowed
	Obligations    Obligations // conditions an allowed request must meet
	PolicyRevision string      // the policy revision that decided
	EvaluatedAt    time.Time   // when it was decided
}

// Obligations are what policy requires of an allowed request. The zero value
// imposes nothing beyond the gateway's own defaults.
type Obligations struct {
	MaxTTL        time.Duration // cap on a grant's lifetime; 0 means the gateway default
	RequireTLS    bool          // the connection must use a TLS secure channel
	AuthMode      string        // Auth*; "" means the gateway default
	MinHash       string        // weakest DH-HMAC-CHAP hash: sha256, sha384, sha512
	MinDHGroup    string        // weakest DH group: null, ffdhe2048 ... ffdhe8192
	Bidirectional bool          // the controller must authenticate to the host too
	ReadOnly      bool          // the host gets read-only access
	MaxIOPS       uint64        // QoS cap; 0 means none
	MaxMBps       uint64        // QoS cap; 0 means none
	// ReauthWithin is how long a grant issued under weaker obligations
	// has to renew once a change makes them stronger, before it is
	// revoked; 0 means DefaultReauthWithin.
	ReauthWithin time.Duration
}

// DefaultReauthWithin is Obligations.ReauthWithin when policy sets none.
const DefaultReauthWithin = 5 * time.Minute

// Reauth is ReauthWithin, or its default.
func (o Obligations) Reauth() time.Duration {
	if o.ReauthWithin > 0 {
		return o.ReauthWithin
	}
	return DefaultReauthWithin
}
