package authz

import (
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
)

// Roles a SPIFFE ID's path maps to (DESIGN §3). The role only names the
// convention the ID follows; what a role may do is policy's decision.
const (
	RoleAdmin     = "admin"     // spiffe://<td>/admin/<name>: security administrator
	RoleAuditor   = "auditor"   // spiffe://<td>/auditor/<name>
	RoleNode      = "node"      // spiffe://<td>/node/<host>: node agent on a GPU host
	RoleTarget    = "target"    // spiffe://<td>/target/<id>: target agent on a storage server
	RoleScheduler = "scheduler" // spiffe://<td>/tenant/<tenant>/scheduler/<name>
	RoleGateway   = "gateway"   // spiffe://<td>/gateway/<name>: a gateway replica
	RoleUnknown   = "unknown"   // any other path; the default policy grants it nothing but health
)

// Caller is the authenticated identity of a request, as policy sees it
// (input.caller).
type Caller struct {
	ID          string `json:"id"`           // full SPIFFE ID, spiffe://<td>/<path>
	TrustDomain string `json:"trust_domain"` // the ID's trust domain
	Role        string `json:"role"`         // one of the Role* constants
	Tenant      string `json:"tenant"`       // schedulers only; "" otherwise
	Name        string `json:"name"`         // the last path segment of a known role; "" for RoleUnknown
}

// ParseCaller maps a SPIFFE ID to a Caller by the path conventions of
// DESIGN §3. Segments must match exactly: a path with more or fewer
// segments than its convention, an invalid tenant name, or a target ID that
// is not a DNS label yields RoleUnknown with Tenant and Name empty. The zero
// ID yields a Caller with only Role set (RoleUnknown).
//
// Go parses the convention so every policy sees the same fields; a site that
// names workloads differently can still match input.caller.id in Rego.
func ParseCaller(id spiffeid.ID) Caller {
	if id.IsZero() {
		return Caller{Role: RoleUnknown}
	}
	c := Caller{ID: id.String(), TrustDomain: id.TrustDomain().Name(), Role: RoleUnknown}
	// spiffeid guarantees a path of "/"-separated non-empty segments of
	// [A-Za-z0-9._-], none of them "." or "..". The segments are cut into
	// an array on the stack: the call limiter classifies every call by its
	// caller's role (gateway/limit.go), so this allocates nothing.
	var buf [4]string
	seg := pathSegments(id.Path(), &buf)
	switch {
	case len(seg) == 2 && seg[0] == "admin":
		c.Role, c.Name = RoleAdmin, seg[1]
	case len(seg) == 2 && seg[0] == "auditor":
		c.Role, c.Name = RoleAuditor, seg[1]
	case len(seg) == 2 && seg[0] == "node":
		c.Role, c.Name = RoleNode, seg[1]
	case len(seg) == 2 && seg[0] == "gateway":
		c.Role, c.Name = RoleGateway, seg[1]
	case len(seg) == 2 && seg[0] == "target" && nvmegate.ValidateLabel("target", seg[1]) == nil:
		c.Role, c.Name = RoleTarget, seg[1]
	case len(seg) == 4 && seg[0] == "tenant" && seg[2] == "scheduler" && nvmegate.ValidateTenant("tenant", seg[1]) == nil:
		c.Role, c.Tenant, c.Name = RoleScheduler, seg[1], seg[3]
	}
	return c
}

// pathSegments cuts path ("/a/b/…") into buf and returns the segments, or
// nil if there are more than fit: no convention has more than four.
func pathSegments(path string, buf *[4]string) []string {
	rest := strings.TrimPrefix(path, "/")
	n := 0
	for {
		if n == len(buf) {
			return nil
		}
		var more bool
		buf[n], rest, more = strings.Cut(rest, "/")
		n++
		if !more {
			return buf[:n]
		}
	}
}
