# METADATA
# title: nvmegate authorization
# description: |
#   The gateway evaluates data.nvmegate.authz.decision once per RPC, with the
#   input document described in policy/README.md. The decision is always
#   defined: a request no rule allows is denied with a reason.
#
#   What each role may do, the data classes and the residency geo-fence are
#   data (data.nvmegate, policy/data.json); the rules only interpret them.
#   Files: authz.rego (the decision, roles, identity), input.rego (reading
#   input.resource), scope.rego (tenant, job and target scopes), admit.rego,
#   residency.rego, classes.rego (classes and obligations), data.rego (the
#   checks of data.nvmegate the engine runs once per revision).
#
#   Every check has two halves. A positive rule (input_ok, job_ok,
#   tenant_ok, namespaces_ok, ...) decides: allow needs all that apply, so a
#   field that is missing or of the wrong type makes a check fail, never
#   pass. Only when a request is denied are the problems computed: the
#   reasons, one per failed check. The split keeps an allow cheap (every rule
#   evaluated costs microseconds) and the tests (the property test in
#   authz/property_test.go above all) hold the two halves to each other.
#
#   Beware of two Rego traps the rules avoid: an else branch is taken when
#   the previous branch's value is undefined, not only when its body fails
#   (so checks that must not fall through are separate definitions, see
#   action_checks); and `not f(x.y)` is false, not true, when x.y is
#   undefined (the argument is evaluated outside the negation), so negated
#   calls take values that are always defined (object.get, helper rules).
package nvmegate.authz

# decision is the one document the gateway reads. Every field is always
# defined; the gateway fails closed on anything else (a missing field, a
# non-boolean allow, a deny without reasons, an obligation it does not know).
# Connect and renew (split_actions) are decided in parts, as the gateway
# decides them (connect.rego).
decision := {"allow": true, "reasons": [fast[0]], "obligations": fast[1]} if {
	not input.action in split_actions
	fast
} else := split_decision if {
	input.action in split_actions
} else := {"allow": false, "reasons": deny_reasons, "obligations": {}}

# allow: the decision's outcome, for tests and other rules.
default allow := false

allow if {
	not input.action in split_actions
	fast
}

allow if {
	input.action in split_actions
	split_decision.allow == true
}

# --- The fast path: deciding ------------------------------------------------

# fast: [the reason that grants, the obligations] when the request is
# allowed, else undefined. Written as few, long rules: evaluating a rule
# costs more than evaluating an expression, and every allow goes through
# here.
fast := g if {
	input_ok
	g := grant
}

grant := [sprintf("any caller of trust domain %s may perform %s", [input.gateway.trust_domain, input.action]), {}] if {
	open_grant
} else := scope_grant(role_scope) if {
	role_grant
}

# scope_grant(scope): [reason, obligations] if the role's checks for its
# scope pass (scope.rego); the checks of namespace actions (residency.rego,
# classes.rego) and of admissions (admit.rego) apply in every scope.
scope_grant("global") := [sprintf("role %s may perform %s", [input.caller.role, input.action]), ob] if {
	ob := action_checks(object.get(input.resource, ["job", "tenant"], ""))
}

scope_grant("tenant") := [sprintf("role %s may perform %s for tenant %s", [input.caller.role, input.action, t]), ob] if {
	t := input.caller.tenant
	tenant_ok(t)
	ob := action_checks(t)
}

scope_grant("job") := [sprintf("role %s may perform %s in job %s", [input.caller.role, input.action, input.resource.job.job_id]), ob] if {
	t := input.resource.job.tenant
	job_ok(t)
	ob := action_checks(t)
}

scope_grant("target") := [sprintf("role %s may perform %s on target %s", [input.caller.role, input.action, input.caller.name]), {}] if {
	target_ok
}

# action_checks(t): the obligations of an allowed action whose checks pass,
# for tenant t's resources: namespace actions are judged on their namespaces,
# admissions on the job (connect and renew: connect.rego). (One
# definition per kind of action, not an else chain: an else chain would
# fall through to the next branch when a check fails.)
action_checks(t) := {} if {
	not input.action in namespace_actions
	t == t
}

action_checks(t) := {} if {
	input.action in admit_actions
	admit_ok
	namespaces_ok(t)
}

action_checks(t) := {} if {
	input.action == "access.discover"
	namespaces_ok(t)
}

# --- Roles ---------------------------------------------------------------

# role_def is the caller's role in data.nvmegate.roles:
# {"scope": "global"|"tenant"|"job"|"target", "actions": ["svc.method", "svc.*", ...]}.
role_def := data.nvmegate.roles[input.caller.role]

role_scope := role_def.scope

# role_grant: the caller's role lists the action, exactly or as "<service>.*".
role_grant if input.action in role_def.actions

role_grant if service_wildcard in role_def.actions

# open_grant: any caller of the gateway's trust domain may perform the action.
open_grant if input.action in open_actions

open_grant if service_wildcard in open_actions

default open_actions := []

open_actions := data.nvmegate.authenticated_actions

service_wildcard := concat("", [split(input.action, ".")[0], ".*"]) if is_string(input.action)

# checked_call: the role grants the action and its checks apply.
checked_call if {
	role_grant
	not open_grant
}

namespace_actions := {"jobs.admit", "jobs.update_nodes", "access.discover", "access.connect", "access.renew"}

# admit_actions are decided as an admission: a change of a job's nodes is
# the admission of the job with its new node set.
admit_actions := {"jobs.admit", "jobs.update_nodes"}

subsystem_actions := {"access.connect", "access.renew"}

namespace_call if {
	input.action in namespace_actions
	checked_call
}

admit_call if {
	input.action in admit_actions
	checked_call
}

# --- The slow path: reasons for a deny -----------------------------------------

deny_reasons := sort(problems) if {
	count(problems) > 0
} else := [sprintf("request is outside the scope of role %v", [input.caller.role])] if {
	checked_call
} else := [sprintf("no rule allows role %v to perform %v", [input.caller.role, input.action])]

problems contains p if some p in input_problems

problems contains p if {
	checked_call
	some p in scope_problems
}

problems contains p if {
	namespace_call
	some p in namespace_problems
}

problems contains p if {
	admit_call
	some p in admit_problems
}

scope_problems := tenant_problems if {
	role_scope == "tenant"
} else := job_problems if {
	role_scope == "job"
} else := target_problems if {
	role_scope == "target"
} else := set() if {
	role_scope == "global"
} else := {sprintf("data error: role %v has unknown scope %v", [input.caller.role, role_scope])}

# --- The request itself ----------------------------------------------------

action_pattern := `^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$`

# input_ok: the fields the gateway always sets are there, and the caller is
# of the gateway's trust domain.
input_ok if {
	td := input.gateway.trust_domain
	is_string(td)
	td != ""
	input.caller.trust_domain == td
	is_string(input.caller.id)
	startswith(input.caller.id, concat("", ["spiffe://", td, "/"]))
	is_string(input.caller.role)
	input.caller.role != ""
	is_string(input.rpc.service)
	input.rpc.service != ""
	is_string(input.rpc.method)
	input.rpc.method != ""
	is_string(input.action)
	regex.match(action_pattern, input.action)
	is_object(input.resource)
}

# required_fields are the input fields the gateway always sets, with the
# reason to deny when one is missing, empty or not a string: such an input
# was not built by the gateway, so fail closed.
required_fields := {
	"caller has no SPIFFE ID": ["caller", "id"],
	"caller has no trust domain": ["caller", "trust_domain"],
	"caller has no role": ["caller", "role"],
	"request names no RPC service": ["rpc", "service"],
	"request names no RPC method": ["rpc", "method"],
	"request names no action": ["action"],
	"gateway trust domain is not set": ["gateway", "trust_domain"],
}

input_problems contains reason if {
	some reason, path in required_fields
	not string_at(path)
}

input_problems contains "request has no resource description" if not has_resource_record

has_resource_record if is_object(input.resource)

input_problems contains sprintf("request action %s is not of the form service.method", [input.action]) if {
	non_empty(input.action)
	not regex.match(action_pattern, input.action)
}

input_problems contains msg if {
	non_empty(input.caller.trust_domain)
	non_empty(input.gateway.trust_domain)
	input.caller.trust_domain != input.gateway.trust_domain
	msg := sprintf("caller trust domain %s is not the gateway's trust domain %s", [
		input.caller.trust_domain,
		input.gateway.trust_domain,
	])
}

input_problems contains "caller SPIFFE ID is not in the caller's trust domain" if {
	non_empty(input.caller.id)
	non_empty(input.caller.trust_domain)
	not startswith(input.caller.id, concat("", ["spiffe://", input.caller.trust_domain, "/"]))
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

# show_at renders obj[key] for a reason, "<missing>" if it is undefined.
default show_at(_, _) := "<missing>"

show_at(obj, key) := sprintf("%v", [obj[key]])

# has_key: obj has key k, whatever its value (also false or null).
has_key(obj, k) if obj[k] = _
