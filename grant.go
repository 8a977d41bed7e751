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

	// RemovalPending: the grant ended, but its target has not yet
	// acknowledged a state without its host, which may still reach the
	// subsystem. Set in the commit that ends the grant, cleared once the
	// target follows (lease retries until it does).
	RemovalPending bool

	// SupersededBy is, for a grant a connect of its node replaced (ended
	// as released in the new grant's commit), the new grant's ID: if the
	// target then refuses the new grant, this one is put back, and only
	// then (lease.Lifecycle.Issue).
	SupersededBy string

	// ReauthBy, if set, is when an active grant must have renewed: a
	// change (ReauthWhy says which) made its obligations stronger than
	// those it was issued under, and it is revoked if it has not renewed
	// by then. A renewal, which meets the obligations in force, clears
	// both.
	ReauthBy  time.Time
	ReauthWhy string
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
	if err := ValidateString(field, v); err != nil {
		return err
	}
	if !grantIDRE.MatchString(v) {
		return Invalid(field, "must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-' (got %s)", show(v))
	}
	return nil
}

// DefaultGrantTTL is a grant's lifetime when the node asks for none.
const DefaultGrantTTL = time.Hour

// GrantExpiry is when a grant issued or renewed at now ends: now+ttl
// (DefaultGrantTTL if ttl ≤ 0), capped by the policy's max TTL (if any)
// and the job's expiry.
func GrantExpiry(now time.Time, ttl, maxTTL time.Duration, jobExpiry time.Time) time.Time {
	if ttl <= 0 {
		ttl = DefaultGrantTTL
	}
	if maxTTL > 0 && ttl > maxTTL {
		ttl = maxTTL
	}
	exp := now.Add(ttl)
	if jobExpiry.Before(exp) {
		exp = jobExpiry
	}
	return exp
}

// ApplyObligations sets how g's credentials are made and the target
// programmed from a decision's obligations and what subsystem sub on
// target t supports: hash, DH group, bidirectional authentication, TLS,
// read-only. It refuses (ECONFLICT) what sub or t cannot enforce: TLS on a
// subsystem without a TLS port, DH-HMAC-CHAP on one without it, and TLS
// without DH-HMAC-CHAP on an nvmet target. nvmet does not compare a TLS
// session's PSK identity with the host NQN of the Connect command, so
// there TLS alone would let a host holding its own PSK connect as any
// other host the port allows: DH-HMAC-CHAP inside the session is what
// authenticates the host NQN (the shipped policy asks for auth_mode
// "both" on nvmet).
func (g *Grant) ApplyObligations(sub *Subsystem, t *Target, ob Obligations) error {
	g.ReadOnly = ob.ReadOnly
	if err := g.credentialParams(sub, ob); err != nil {
		return err
	}
	if t.Driver == DriverNVMet && g.DHCHAPHash == "none" {
		return Errorf(ECONFLICT, "policy asks for TLS without DH-HMAC-CHAP on %s; its nvmet target does not bind a TLS PSK to the host NQN, so a grant there needs DH-HMAC-CHAP too (auth_mode both); not granted", sub.NQN)
	}
	return nil
}

// credentialParams fills g's credential settings from the obligations and
// what the subsystem supports.
func (g *Grant) credentialParams(sub *Subsystem, ob Obligations) error {
	g.DHCHAPHash, g.DHGroup = ob.MinHash, ob.MinDHGroup
	if g.DHCHAPHash == "" {
		g.DHCHAPHash = "sha256"
	}
	if g.DHGroup == "" {
		g.DHGroup = "ffdhe2048"
	}
	g.Bidirectional = ob.Bidirectional
	wantTLS := ob.RequireTLS || ob.AuthMode == AuthTLS || ob.AuthMode == AuthBoth
	if wantTLS && !sub.TLS {
		return Errorf(ECONFLICT, "policy requires TLS but subsystem %s has no TLS port", sub.NQN)
	}
	if !sub.DHCHAP && ob.AuthMode != AuthTLS {
		return Errorf(ECONFLICT, "subsystem %s does not do DH-HMAC-CHAP", sub.NQN)
	}
	g.TLS = wantTLS
	if !sub.DHCHAP || ob.AuthMode == AuthTLS {
		// TLS only: no DH-HMAC-CHAP secrets at all.
		g.DHCHAPHash, g.DHGroup, g.Bidirectional = "none", "", false
	}
	return nil
}

// Shortfalls are what g, as issued, falls short of under obligations ob
// for subsystem sub on target t at time now: a weaker hash or DH group,
// no bidirectional authentication, TLS or read-only where ob asks for
// them, a lifetime past ob's max TTL. Empty: g meets ob. An error: ob can
// no longer be met there at all (ApplyObligations refuses it).
func (g *Grant) Shortfalls(sub *Subsystem, t *Target, ob Obligations, now time.Time) ([]string, error) {
	want := *g
	if err := want.ApplyObligations(sub, t, ob); err != nil {
		return nil, err
	}
	var out []string
	if want.DHCHAPHash != "none" && hashRank[g.DHCHAPHash] < hashRank[want.DHCHAPHash] {
		out = append(out, "hash "+g.DHCHAPHash+" is weaker than "+want.DHCHAPHash)
	}
	if want.DHCHAPHash != "none" && groupRank[g.DHGroup] < groupRank[want.DHGroup] {
		out = append(out, "DH group "+g.DHGroup+" is weaker than "+want.DHGroup)
	}
	if want.Bidirectional && !g.Bidirectional {
		out = append(out, "bidirectional authentication is required")
	}
	if want.TLS && !g.TLS {
		out = append(out, "TLS is required")
	}
	if want.ReadOnly && !g.ReadOnly {
		out = append(out, "read-only access is required")
	}
	if ob.MaxTTL > 0 && g.ExpiresAt.Sub(now) > ob.MaxTTL {
		out = append(out, "it lives past the max TTL of "+ob.MaxTTL.String())
	}
	return out, nil
}

// HostEntry is what the grants sharing one host entry on a target (one
// host NQN, one key scope) must agree on: the target holds one set of
// credentials for them.
type HostEntry struct {
	KeyVersion    uint64
	DHCHAPHash    string
	DHGroup       string
	Bidirectional bool
}

// HostEntry is g's host entry.
func (g *Grant) HostEntry() HostEntry {
	return HostEntry{KeyVersion: g.KeyVersion, DHCHAPHash: g.DHCHAPHash, DHGroup: g.DHGroup, Bidirectional: g.Bidirectional}
}

// SharesHostEntry reports whether o is on g's host entry of a target: the
// same host NQN in the same key scope (on nvmet one entry per host per
// target, on SPDK per subsystem).
func (g *Grant) SharesHostEntry(o *Grant) bool {
	return o.HostNQN == g.HostNQN && o.Scope() == g.Scope()
}

// JoinHostEntry makes g's authentication satisfy o's too, o sharing g's
// host entry: the target holds one set of credentials for both, and
// obligations are minimums — a stronger hash or DH group, or
// bidirectional authentication, satisfies a weaker one. Only a TLS or
// DH-HMAC-CHAP mismatch cannot be merged (ECONFLICT: the node must
// release o first).
func (g *Grant) JoinHostEntry(o *Grant) error {
	if o.TLS != g.TLS || (o.DHCHAPHash == "none") != (g.DHCHAPHash == "none") {
		return Errorf(ECONFLICT,
			"host %s holds grant %s (subsystem %s) secured by %s, this one by %s; the target keeps one set of credentials per host: release that grant first",
			g.HostNQN, o.ID, o.SubsystemNQN, o.security(), g.security())
	}
	g.DHCHAPHash = stronger(hashRank, g.DHCHAPHash, o.DHCHAPHash)
	g.DHGroup = stronger(groupRank, g.DHGroup, o.DHGroup)
	g.Bidirectional = g.Bidirectional || o.Bidirectional
	return nil
}

func (g *Grant) security() string {
	switch {
	case g.TLS && g.DHCHAPHash == "none":
		return "TLS"
	case g.TLS:
		return "TLS and DH-HMAC-CHAP"
	}
	return "DH-HMAC-CHAP"
}

var (
	hashRank  = map[string]int{"sha256": 1, "sha384": 2, "sha512": 3}
	groupRank = map[string]int{"null": 0, "ffdhe2048": 1, "ffdhe3072": 2, "ffdhe4096": 3, "ffdhe6144": 4, "ffdhe8192": 5}
)

// stronger is the stronger of a and b by rank (a if either is unranked).
func stronger(rank map[string]int, a, b string) string {
	ra, oka := rank[a]
	rb, okb := rank[b]
	if oka && okb && rb > ra {
		return b
	}
	return a
}

// HostRef names a host entry of a target whose grants changed: a host on a
// subsystem, and the node whose grant it is (the store reads a node's
// grants without reading the subsystem's others). Whoever changes grants
// tells the target's programmer the HostRefs it changed.
type HostRef struct {
	SubsystemNQN string
	HostNQN      string
	Node         string // "" if not known: the subsystem's grants are read
}

// HostRef is the host entry g belongs to.
func (g *Grant) HostRef() HostRef {
	return HostRef{SubsystemNQN: g.SubsystemNQN, HostNQN: g.HostNQN, Node: g.Node}
}

// HostRefs are the host entries of gs.
func HostRefs(gs ...*Grant) []HostRef {
	out := make([]HostRef, len(gs))
	for i, g := range gs {
		out[i] = g.HostRef()
	}
	return out
}
