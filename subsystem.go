package nvmegate

import (
	"strconv"
	"time"
)

// Subsystem is an NVM subsystem on one target. A host that connects to it sees
// every namespace in it (targets do not mask namespaces per host), so a
// subsystem belongs to exactly one tenant and all its namespaces do too.
type Subsystem struct {
	NQN         string    // subsystem NQN, unique across the inventory
	TargetID    string    // the target that exports it
	Tenant      string    // owning tenant
	PortIDs     []uint16  // target ports it listens on; at least one
	DHCHAP      bool      // the target may require DH-HMAC-CHAP in-band authentication
	TLS         bool      // the target may require a TLS secure channel (needs a TLS port)
	Description string    // free text for operators, at most 256 bytes
	CreatedAt   time.Time // set by the store
}

// Validate checks the subsystem on its own. The store checks that the target
// and ports exist and that TLS has a TLS-capable port.
func (s *Subsystem) Validate() error {
	if err := ValidateNQN("nqn", s.NQN); err != nil {
		return err
	}
	if err := ValidateLabel("target_id", s.TargetID); err != nil {
		return err
	}
	if err := ValidateTenant("tenant", s.Tenant); err != nil {
		return err
	}
	if len(s.PortIDs) == 0 {
		return Invalid("port_ids", "at least one port is required")
	}
	seen := make(map[uint16]bool, len(s.PortIDs))
	for i, id := range s.PortIDs {
		field := "port_ids[" + strconv.Itoa(i) + "]"
		if id == 0 {
			return Invalid(field, "must be 1-65535")
		}
		if seen[id] {
			return Invalid(field, "port %d appears twice", id)
		}
		seen[id] = true
	}
	if !s.DHCHAP && !s.TLS {
		// Without either, any host that knows an allowed NQN gets in: the
		// gateway's credentials would protect nothing.
		return Invalid("dhchap", "a subsystem must support DH-HMAC-CHAP, TLS or both")
	}
	return ValidateText("description", s.Description, false)
}
