package nvmegate

import "time"

// HostBinding binds a node's SPIFFE ID to the one host NQN it may use. A node
// can never obtain credentials for a host NQN bound to another identity.
// Nodes without an explicit binding use the NQN derived from their SPIFFE ID.
//
// Nor can a node be bound to a host NQN that an active grant of another
// identity still uses: the targets would take the new node as the grant's
// host (store.CreateHostBinding refuses it until those grants end).
type HostBinding struct {
	SPIFFEID  string    // spiffe://<td>/node/<host>
	HostNQN   string    // the node's host NQN; canonical (nqn.go), unique across bindings
	Tenant    string    // optional: restrict the node to one tenant's jobs
	CreatedAt time.Time // set by the store
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
	return nil
}
