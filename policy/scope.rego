package nvmegate.authz

# --- Scopes -------------------------------------------------------------------
#
# A role's scope (data.nvmegate.roles[role].scope) bounds what its actions may
# touch:
#
#   global  anything (admins, auditors);
#   tenant  the caller's tenant only (schedulers): input.resource.tenant and
#           the tenant of every record (job, subsystem, namespaces) must be
#           the caller's;
#   job     an active, unexpired job that names the caller, with the caller's
#           own host binding, for the job's tenant only (nodes);
#   target  the caller's own target only (target agents).
#
# Reasons name only what the caller sent or may know: the other tenant of a
# record is never named, and a node learns nothing about a job that does not
# name it.

# subject_tenant: the tenant whose resources the call may touch (for the
# reasons of a deny).
subject_tenant := input.caller.tenant if role_scope == "tenant"

subject_tenant := job.tenant if {
	role_scope == "job"
	node_in_job
}

subject_tenant := job.tenant if role_scope == "global"

# --- tenant: schedulers ---------------------------------------------------------

# tenant_ok(t): the request concerns only tenant t's resources.
tenant_ok(t) if {
	is_string(t)
	t != ""
	res := input.resource
	res.tenant == t
	object.get(res, ["job", "tenant"], t) == t
	object.get(res, ["subsystem", "tenant"], t) == t
	namespace_tenants_ok(t)
}

tenant_problems contains sprintf("role %s has no tenant", [input.caller.role]) if {
	not non_empty(object.get(input.caller, "tenant", null))
}

tenant_problems contains sprintf("a %s of tenant %s may act only on tenant %s's resources", [input.caller.role, t, t]) if {
	t := input.caller.tenant
	non_empty(t)
	not resource.tenant == t
}

# A job or subsystem the gateway could not find is described by its key
# alone (no tenant): it is not the caller's either, and the reasons are the
# same as for another tenant's, so that they do not say whether it exists.
tenant_problems contains sprintf("job %s is not in tenant %s", [show_at(job, "job_id"), t]) if {
	t := input.caller.tenant
	is_object(resource.job)
	not job.tenant == t
}

tenant_problems contains sprintf("subsystem %s is not in tenant %s", [show_at(subsystem, "nqn"), t]) if {
	t := input.caller.tenant
	is_object(resource.subsystem)
	not subsystem.tenant == t
	not foreign_namespace_resource(t)
}

# foreign_namespace_resource(t): a namespace resource naming a namespace
# that is not tenant t's. Its refusal names the namespace alone: the
# gateway describes a namespace it found with its subsystem and one it did
# not without, so a reason about the subsystem would tell which.
foreign_namespace_resource(t) if {
	resource.kind == "namespace"
	some ns in namespaces
	not ns.tenant == t
}

# A namespace the gateway could not find has no tenant: it is not the
# caller's either, and the reason does not say whether it exists.
tenant_problems contains sprintf("namespace %s is not in tenant %s", [ns_label(ns), t]) if {
	t := input.caller.tenant
	some ns in namespaces
	not ns.tenant == t
}

tenant_problems contains p if some p in list_shape_problems("namespaces", "namespace")

# --- job: nodes -----------------------------------------------------------------

node_in_job if input.caller.id in job.nodes

# job_ok(t): the caller is a node of job t's active, unexpired scope, with
# its own binding, and the request concerns only tenant t's resources.
job_ok(t) if {
	job_caller_ok(t)
	now_ns < time_ns(input.resource.job.expires_at)
	res := input.resource
	object.get(res, "tenant", "") in {"", t}
	object.get(res, ["subsystem", "tenant"], t) == t
	namespace_tenants_ok(t)
}

# job_caller_ok(t): what job_ok checks of the caller and its records, but
# the time: the caller is a node of job t's active scope, with its own
# binding and host NQN (the caller decision of connect and renew).
job_caller_ok(t) if {
	is_string(t)
	t != ""
	c := input.caller
	res := input.resource
	j := res.job
	c.id in j.nodes
	j.state == "active"
	b := res.host_binding
	b.spiffe_id == c.id
	nqn := b.host_nqn
	is_string(nqn)
	nqn != ""
	is_boolean(object.get(b, "bound", false))
	object.get(b, "tenant", "") in {"", t}
	is_object(object.get(res, "request", {}))
	object.get(res, ["request", "host_nqn"], "") in {"", nqn}
	object.get(res, ["request", "mode"], "") in {"", "ro", "rw"}
	segment_ok
}

# --- job: fabric segmentation ------------------------------------------------------
#
# A node's host binding may carry its fabric segment (host_binding.subnets,
# CIDR prefixes); the subsystem's ports the subnets they serve
# (resource.ports, [{id, subnet}], for a connect or renew). A segmented
# node may connect or renew only if a port of the subsystem serves a
# subnet inside one of its subnets; a node without subnets is not
# segmented. (The gateway lists only those ports in Discover and in the
# connect's answer: nvmegate.HostBinding.Reaches, the same rule.)

segment_actions := {"access.connect", "access.renew"}

default segment_ok := false

segment_ok if not input.action in segment_actions

segment_ok if {
	input.action in segment_actions
	object.get(input.resource, ["host_binding", "subnets"], []) == []
}

segment_ok if {
	input.action in segment_actions
	some p in input.resource.ports
	some s in input.resource.host_binding.subnets
	is_string(s)
	port_in_segment(p, s)
}

# port_in_segment(p, s): port p serves a subnet inside subnet s.
port_in_segment(p, s) if {
	non_empty(p.subnet)
	net.cidr_contains(s, p.subnet)
}

# (The caller's part of a connect does not hold the subsystem, only its
# ports: the reason names the node.)
job_problems contains sprintf("no port of the subsystem serves node %s's fabric segment", [input.caller.id]) if {
	node_in_job
	not segment_ok
}

job_problems contains "request names no job" if not has_job_record

has_job_record if is_object(resource.job)

job_problems contains sprintf("node %s is not in the scope of job %s", [input.caller.id, show_at(job, "job_id")]) if {
	has_job_record
	not node_in_job
}

job_problems contains "request has no host binding for the caller" if not has_binding_record

has_binding_record if is_object(resource.host_binding)

job_problems contains "host binding is not the caller's" if {
	has_binding_record
	not host_binding.spiffe_id == input.caller.id
}

job_problems contains "host binding has no host NQN" if {
	host_binding.spiffe_id == input.caller.id
	not non_empty(object.get(host_binding, "host_nqn", null))
}

job_problems contains sprintf("host NQN %v is not bound to node %s", [request.host_nqn, input.caller.id]) if {
	not object.get(request, "host_nqn", "") in {"", object.get(host_binding, "host_nqn", null)}
}

job_problems contains p if some p in record_shape_problems("job", "job")

job_problems contains p if some p in record_shape_problems("host_binding", "binding")

job_problems contains p if some p in record_shape_problems("request", "request")

job_problems contains "request time is not an RFC 3339 time" if not input_time_valid

# The problems below are named only for a job that names the caller: a node
# learns nothing about other jobs.
job_problems contains p if {
	node_in_job
	some p in job_member_problems
}

job_member_problems contains sprintf("job %s has no tenant", [show_at(job, "job_id")]) if {
	not non_empty(object.get(job, "tenant", null))
}

job_member_problems contains sprintf("job %s is not active (state %s)", [show_at(job, "job_id"), show_at(job, "state")]) if {
	not job.state == "active"
}

job_member_problems contains sprintf("job %s has no valid expiry", [show_at(job, "job_id")]) if {
	not valid_time(object.get(job, "expires_at", null))
}

job_member_problems contains sprintf("job %s expired at %s", [show_at(job, "job_id"), job.expires_at]) if {
	expiry_ns <= now_ns
}

job_member_problems contains sprintf("node %s is bound to a tenant other than job %s's", [input.caller.id, show_at(job, "job_id")]) if {
	not object.get(host_binding, "tenant", "") in {"", object.get(job, "tenant", null)}
}

job_member_problems contains p if some p in job_tenant_problems

# job_tenant_problems: records of a tenant other than the job's. A function
# of the records only (the scope decision of connect and renew names them
# too).
job_tenant_problems contains sprintf("request concerns a tenant other than job %s's", [show_at(job, "job_id")]) if {
	not object.get(resource, "tenant", "") in {"", object.get(job, "tenant", null)}
}

job_tenant_problems contains sprintf("subsystem %s is not in job %s's tenant", [show_at(subsystem, "nqn"), show_at(job, "job_id")]) if {
	has_key(subsystem, "tenant")
	not subsystem.tenant == job.tenant
}

job_tenant_problems contains sprintf("namespace %s is not in job %s's tenant", [ns_label(ns), show_at(job, "job_id")]) if {
	some ns in namespaces
	not ns.tenant == job.tenant
}

job_tenant_problems contains p if some p in list_shape_problems("namespaces", "namespace")

# --- target: target agents --------------------------------------------------------

target_ok if {
	name := input.caller.name
	is_string(name)
	name != ""
	target.id == name
}

target_problems contains sprintf("target agent %v may act only on its own target", [object.get(input.caller, "name", "")]) if {
	not target_ok
}

# --- Helpers ------------------------------------------------------------------------

# namespace_tenants_ok: every namespace is tenant t's (namespace actions
# check it with the other facts of each namespace, in namespaces_ok).
namespace_tenants_ok(t) if {
	input.action in namespace_actions
	t == t
} else if {
	nss := object.get(input.resource, "namespaces", [])
	is_array(nss)
	every ns in nss {
		ns.tenant == t
	}
}

ns_label(ns) := sprintf("%v/%v", [show_at(ns, "subsystem_nqn"), show_at(ns, "nsid")])
