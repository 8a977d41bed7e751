package nvmegate

import (
	"fmt"
	"net/netip"
	"time"
)

// HostBinding binds a node's SPIFFE ID to the one host NQN it may use. A node
// can never obtain credentials for a host NQN bound to another identity.
// Nodes without an explicit binding use the NQN derived from their SPIFFE ID.
//
// Nor can a node be bound to a host NQN that an active grant of another
// identity still uses: the targets would take the new node as the grant's
// host (store.CreateHostBinding refuses it until those grants end).
type HostBinding struct {
	SPIFFEID string // spiffe://<td>/node/<host>
	HostNQN  string // the node's host NQN; canonical (nqn.go), unique across bindings
	Tenant   string // optional: restrict the node to one tenant's jobs
	// Subnets are the node's fabric segment: the subnets it reaches
	// targets from (canonical CIDR prefixes). None: the node is not
	// segmented and may use every port of its grants' subsystems.
	Subnets   []string
	CreatedAt time.Time // set by the store
}

// MaxSubnets bounds a binding's segment.
const MaxSubnets = 16

// Reaches reports whether a node with this binding may use port p: it is
// not segmented, or p serves a subnet inside one of its subnets. The
// shipped Rego decides connects by the same rule (segment_ok), and a
// property test holds the two to each other.
func (h *HostBinding) Reaches(p Port) bool {
	if len(h.Subnets) == 0 {
		return true
	}
	pp, err := netip.ParsePrefix(p.Subnet)
	if err != nil {
		return false
	}
	for _, s := range h.Subnets {
		if hp, err := netip.ParsePrefix(s); err == nil && hp.Bits() <= pp.Bits() && hp.Contains(pp.Addr()) {
			return true
		}
	}
	return false
}

// Validate checks the binding on its own; the store checks uniqueness.
func (h *HostBinding) Validate() error {
	if err := ValidateNodeID("spiffe_id", h.SPIFFEID); err != nil {
		return err
	}
	if err := ValidateHostNQN("host_nqn", h.HostNQN); err != nil {
		return err
	}
	if h.Tenant != "" {
		if err := ValidateTenant("tenant", h.Tenant); err != nil {
			return err
		}
	}
	if len(h.Subnets) > MaxSubnets {
		return Invalid("subnets", "at most %d subnets (got %d)", MaxSubnets, len(h.Subnets))
	}
	seen := map[string]bool{}
	for i, s := range h.Subnets {
		if _, err := ParseSubnet(fmt.Sprintf("subnets[%d]", i), s); err != nil {
			return err
		}
		if seen[s] {
			return Invalid(fmt.Sprintf("subnets[%d]", i), "%s appears twice", s)
		}
		seen[s] = true
	}
	return nil
}
