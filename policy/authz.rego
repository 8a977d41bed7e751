# METADATA
# title: nvmegate authorization
# description: |
#   The gateway evaluates data.nvmegate.authz.decision once per RPC, with the
#   input document described in authz/doc.go. The decision is always defined:
#   a request no rule allows is denied with a reason.
package nvmegate.authz

# decision is the one document the gateway reads. Every field is always
# defined; the gateway fails closed on anything else (a missing field, a
# non-boolean allow, a deny without reasons, an obligation it does not know).
decision := {
	"allow": allow,
	"reasons": reasons,
	"obligations": obligations,
}

# --- Tables --------------------------------------------------------------
# Data-like on purpose: a later revision moves them to data.nvmegate.* so a
# site can change who may do what without editing rules. Method lists use
# "*" for every method of the service; arrays, not sets, so the tables are
# plain JSON.

# role_permissions maps a caller role to the gRPC services it may call.
role_permissions := {"admin": {
	"nvmegate.v1.Inventory": ["*"],
	"nvmegate.v1.Policy": ["*"],
	"grpc.reflection.v1.ServerReflection": ["*"],
	"grpc.reflection.v1alpha.ServerReflection": ["*"],
}}

# authenticated_services may be called by any caller of the gateway's own
# trust domain, whatever its role (health checks from node agents, probes).
authenticated_services := {"grpc.health.v1.Health": ["*"]}

# --- Outcome -------------------------------------------------------------

# allow: some rule grants the request and no check refuses it.
default allow := false

allow if {
	count(deny) == 0
	count(grants) > 0
}

# reasons: the refusals if any, else the rules that granted, else why
# nothing granted. Sorted so that equal decisions compare equal.
reasons := sort(deny) if {
	count(deny) > 0
} else := sort(grants) if {
	count(grants) > 0
} else := [sprintf("no rule allows role %s to call %s/%s", [
	input.caller.role,
	input.rpc.service,
	input.rpc.method,
])]

# obligations: what an allowed request must meet (max_ttl, require_tls, ...;
# see authz/doc.go). The foundation policy imposes none.
default obligations := {}

# --- Checks that refuse whatever grants -----------------------------------

# required_fields are the input fields the gateway always sets, with the
# reason to deny when one is missing, empty or not a string: such an input
# was not built by the gateway, so fail closed.
required_fields := {
	"caller has no SPIFFE ID": ["caller", "id"],
	"caller has no trust domain": ["caller", "trust_domain"],
	"caller has no role": ["caller", "role"],
	"request names no RPC service": ["rpc", "service"],
	"request names no RPC method": ["rpc", "method"],
	"gateway trust domain is not set": ["gateway", "trust_domain"],
}

deny contains reason if {
	some reason, path in required_fields
	not string_at(path)
}

deny contains msg if {
	non_empty(input.caller.trust_domain)
	non_empty(input.gateway.trust_domain)
	input.caller.trust_domain != input.gateway.trust_domain
	msg := sprintf("caller trust domain %s is not the gateway's trust domain %s", [
		input.caller.trust_domain,
		input.gateway.trust_domain,
	])
}

deny contains "caller SPIFFE ID is not in the caller's trust domain" if {
	non_empty(input.caller.id)
	non_empty(input.caller.trust_domain)
	not startswith(input.caller.id, concat("", ["spiffe://", input.caller.trust_domain, "/"]))
}

# --- Rules that grant -----------------------------------------------------

grants contains sprintf("role %s may call %s", [input.caller.role, input.rpc.service]) if {
	some m in role_permissions[input.caller.role][input.rpc.service]
	method_matches(m)
}

grants contains sprintf("any caller of trust domain %s may call %s", [input.gateway.trust_domain, input.rpc.service]) if {
	some m in authenticated_services[input.rpc.service]
	method_matches(m)
}

# --- Helpers ----------------------------------------------------------------

non_empty(s) if {
	is_string(s)
	s != ""
}

# string_at: input holds a non-empty string at path.
string_at(path) if {
	is_object(input)
	non_empty(object.get(input, path, null))
}

method_matches(m) if m in {"*", input.rpc.method}
