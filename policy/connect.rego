package nvmegate.authz

# --- Connect and renew: one decision in three parts ------------------------------
#
# A grant's decision (access.connect, access.renew) is the most frequent and
# the largest: every namespace of the subsystem, its residency and its
# classes. Most of it does not depend on who asks or when, so the gateway
# decides it in parts (DESIGN §4, "Decisions on the hot path are exact and
# cheap"), each a Rego document of this package:
#
#   scope_decision   the job's scope: tenant ownership, residency, classes,
#                    the subsystem, the merged obligations. Its input
#                    (scope_input) holds the action and the scope's records,
#                    no caller and no time, so it is a pure function of them:
#                    the engine memoizes it by the SHA-256 of its input and
#                    the policy and data revisions. A rule it reaches may not
#                    read input.caller, input.time (or anything but
#                    input.action and input.resource) nor call a
#                    nondeterministic builtin: the engine refuses such a
#                    policy at load.
#   caller_decision  the caller's part: the request's identity fields, the
#                    role and its action, the caller's binding, membership
#                    and state of the job, and the grant these and the scope
#                    decision make (its reason and obligations). Its input
#                    (caller_input) is the request without the time and
#                    without the namespaces and subsystem, with
#                    input.scope_decision; it may read input.caller but not
#                    input.time nor call a nondeterministic builtin, and is
#                    memoized like the scope decision.
#   node_decision    decided on every call: validity in time (the grant's
#                    expiry against the request time). Its input
#                    (node_input) is the caller's input with the time,
#                    input.time_ns (the request time in nanoseconds, when
#                    input.time is valid) and input.caller_decision. Its
#                    document is the decision: allow, reasons (on a deny
#                    every problem, the scope decision's included where the
#                    caller may know them), obligations.
#
# data.nvmegate.authz.decision decides these actions by the same parts
# (split_decision), so opa test and opa eval see what the gateway decides.

split_actions := subsystem_actions

# --- The scope decision -------------------------------------------------------------

# scope_decision: {"allow": bool, "reasons": [...], "obligations": {...}}.
# An allow has no reasons (the caller's part names the grant) and the
# obligations of every grant on the subsystem.
scope_decision := {"allow": true, "reasons": [], "obligations": ob} if {
	ob := scope_obligations
} else := {"allow": false, "reasons": sort(scope_decision_problems), "obligations": {}} if {
	count(scope_decision_problems) > 0
} else := {"allow": false, "reasons": [sprintf("request is outside the scope of job %s", [show_at(job, "job_id")])], "obligations": {}}

# scope_obligations: the obligations of a grant of the job's tenant t on
# the subsystem, if the scope allows it: every record is t's, every
# namespace is in a region the job allows and on a target its geo-fence
# allows, of a known class that allows its mode, and the subsystem can meet
# the classes' obligations.
scope_obligations := merged_obligations if {
	res := input.resource
	t := res.job.tenant
	is_string(t)
	t != ""
	object.get(res, "tenant", "") in {"", t}
	object.get(res, ["subsystem", "tenant"], t) == t
	object.get(res, ["request", "mode"], "") in {"", "ro", "rw"}
	namespaces_ok(t)
	subsystem_ok
}

# scope_namespaces: the namespaces of the job's tenant, whose details the
# reasons name (the others are refused without details).
scope_namespaces := [ns | some ns in namespaces; ns.tenant == job.tenant]

scope_decision_problems contains sprintf("job %s has no tenant", [show_at(job, "job_id")]) if {
	not non_empty(object.get(job, "tenant", null))
}

scope_decision_problems contains p if some p in job_tenant_problems

scope_decision_problems contains p if some p in record_shape_problems("job", "job")

scope_decision_problems contains p if some p in record_shape_problems("request", "request")

scope_decision_problems contains p if some p in job_region_problems

scope_decision_problems contains p if some p in residency_problems(scope_namespaces)

scope_decision_problems contains p if some p in namespace_class_problems(scope_namespaces)

scope_decision_problems contains p if some p in subsystem_detail_problems(scope_namespaces)

# --- The caller decision ------------------------------------------------------------

# caller_decision: {"allow": true, "grant": the decision document of the
# grant (its reason, the scope's obligations), "until_ns": its expiry (job
# roles)} if the caller's part and, for a grant that needs it, the scope
# decision allow; else {"allow": false}: the reasons of a deny are the node
# decision's to give. It reads input.scope_decision, so that the node
# decision, on every call, only checks the time.
caller_decision := object.union({"allow": true, "grant": {"allow": true, "reasons": [g.reason], "obligations": ob}}, object.filter(g, ["until_ns"])) if {
	input_ok
	g := caller_grant
	ob := grant_obligations(g)
} else := {"allow": false}

# grant_obligations(g): the obligations of grant g: the scope decision's if
# the grant needs the scope (and it allows), none otherwise.
grant_obligations(g) := input.scope_decision.obligations if {
	g.scoped == true
	input.scope_decision.allow == true
} else := {} if {
	g.scoped == false
}

# caller_grant: as grant (authz.rego), for the caller's part: open actions
# and target agents get no obligations and need no scope; job roles are
# bounded by the job's expiry.
caller_grant := {"reason": sprintf("any caller of trust domain %s may perform %s", [input.gateway.trust_domain, input.action]), "scoped": false} if {
	open_grant
} else := caller_role_grant(role_scope) if {
	role_grant
}

caller_role_grant("global") := {"reason": sprintf("role %s may perform %s", [input.caller.role, input.action]), "scoped": true}

caller_role_grant("tenant") := {"reason": sprintf("role %s may perform %s for tenant %s", [input.caller.role, input.action, t]), "scoped": true} if {
	t := input.caller.tenant
	tenant_ok(t)
}

caller_role_grant("job") := {
	"reason": sprintf("role %s may perform %s in job %s", [input.caller.role, input.action, j.job_id]),
	"scoped": true,
	"until_ns": time_ns(j.expires_at),
} if {
	j := input.resource.job
	job_caller_ok(j.tenant)
}

caller_role_grant("target") := {"reason": sprintf("role %s may perform %s on target %s", [input.caller.role, input.action, input.caller.name]), "scoped": false} if {
	target_ok
}

# --- The node decision --------------------------------------------------------------

# node_decision: the decision document. The first definition is the path
# of every allowed connect of a node: one comparison, and the grant's
# document as the caller decision has it.
node_decision := d if {
	input.time_ns < input.caller_decision.until_ns
	d := input.caller_decision.grant
} else := d if {
	c := input.caller_decision
	c.allow == true
	not c.until_ns
	d := c.grant
} else := {"allow": false, "reasons": deny_reasons, "obligations": {}}

# The problems of a denied connect or renew (deny_reasons, authz.rego):
# those of the request and the role's scope, decided on the node's input,
# and the scope decision's where the caller may know them.
problems contains p if {
	input.action in split_actions
	checked_call
	details_visible
	some p in input.scope_decision.reasons
}

# --- Inputs of the parts ------------------------------------------------------------
#
# The engine builds these in Go from the request (authz/split.go) and a test
# holds the two to each other; here they compose the parts for
# data.nvmegate.authz.decision.

# scope_input: the action, and of the resource the tenant, target,
# subsystem and namespaces as they are, the job's ID, tenant and allowed
# regions, the requested mode.
scope_input := {"action": input.action, "resource": object.union(
	object.filter(resource, ["tenant", "target", "subsystem", "namespaces"]),
	{k: narrowed(v, keys) |
		some k, keys in {"job": ["job_id", "tenant", "allowed_regions"], "request": ["mode"]}
		v := resource[k]
	},
)}

narrowed(v, keys) := object.filter(v, keys) if is_object(v)

narrowed(v, _) := v if not is_object(v)

# caller_input: the request without the time, and without the namespaces
# and the subsystem (the caller decision also gets input.scope_decision).
caller_input := object.union(object.remove(input, array.concat(node_only_keys, ["resource"])), {"resource": object.remove(input.resource, ["namespaces", "subsystem"])}) if {
	is_object(input.resource)
} else := object.remove(input, node_only_keys)

# node_only_keys: what the node's input has that the caller's has not.
node_only_keys := ["time", "time_ns", "scope_decision", "caller_decision"]

# node_time: what the node's input adds to the caller's: the time (and
# time_ns, if it is valid).
node_time := object.union(object.filter(input, ["time"]), {"time_ns": t | t := now_ns})

# split_parts: the parts of a connect or renew decision, as the engine
# decides them (Policy.Explain shows them).
split_parts := {"scope_input": si, "scope_decision": s, "caller_decision": c, "node_decision": d} if {
	si := scope_input
	s := scope_decision with input as si
	ci := object.union(caller_input, {"scope_decision": s})
	c := caller_decision with input as ci
	d := node_decision with input as object.union(ci, object.union(node_time, {"caller_decision": c}))
}

split_decision := split_parts.node_decision
