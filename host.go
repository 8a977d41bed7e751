package nvmegate

import "time"

// HostBinding binds a node's SPIFFE ID to the one host NQN it may use. A node
// can never obtain credentials for a host NQN bound to another identity.
// Nodes without an explicit binding use the NQN derived from their SPIFFE ID.
type HostBinding struct {
	SPIFFEID  string    // spiffe://<td>/node/<host>
	HostNQN   string    // the node's host NQN; unique across bindings
	Tenant    string    // optional: restrict the node to one tenant's jobs
	CreatedAt time.Time // set by the store
}

// Validate checks the binding on its own; the store checks uniqueness.
func (h *HostBinding) Validate() error {
	if err := ValidateSPIFFEID("spiffe_id", h.SPIFFEID); err != nil {
		return err
	}
	if err := ValidateNQN("host_nqn", h.HostNQN); err != nil {
		return err
	}
	if h.Tenant != "" {
		if err := ValidateTenant("tenant", h.Tenant); err != nil {
			return err
		}
	}
	return nil
}
