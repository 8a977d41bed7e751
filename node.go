package nvmegate

import (
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// A node is a GPU host that runs training jobs and connects to their
// namespaces. It is not a record of its own: its node agent's SPIFFE ID,
// spiffe://<trust domain>/node/<host> (DESIGN §3, authz.RoleNode), names it
// in jobs, grants and host bindings.

// NodePathPrefix starts the SPIFFE ID path of every node agent.
const NodePathPrefix = "/node/"

// ValidateNodeID checks that v is a node's SPIFFE ID: a valid SPIFFE ID
// whose path is exactly /node/<host>, as authz.ParseCaller gives the node
// role. An admin's, a scheduler's or any other workload's ID is refused,
// naming it.
func ValidateNodeID(field, v string) error {
	if err := ValidateSPIFFEID(field, v); err != nil {
		return err
	}
	id, err := spiffeid.FromString(v)
	if err != nil {
		return Invalid(field, "must be a SPIFFE ID: %v", err)
	}
	host, ok := strings.CutPrefix(id.Path(), NodePathPrefix)
	if !ok || host == "" || strings.Contains(host, "/") {
		return Invalid(field, "must be a node's SPIFFE ID spiffe://<trust domain>%s<host>, not another workload's (got %s)", NodePathPrefix, show(v))
	}
	return nil
}
