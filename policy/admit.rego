package nvmegate.authz

# --- Job admission (jobs.admit, and jobs.update_nodes: the job with its new
# node set) ------------------------------------------------------------------
#
# The scheduler's request is described as the job to store (resource.job),
# the stored record of every namespace it names with the requested mode
# (resource.namespaces) and the binding of every node (resource.nodes). The
# scope's tenant checks, residency and classes apply as well.


# binding_ids: the nodes whose binding allows them to run a job of the
# job's tenant (unbound, bound without a tenant, or bound to it); admit_ok
# needs every binding among them.
binding_ids := {b.spiffe_id |
	some b in input.resource.nodes
	b.tenant in {"", input.resource.job.tenant}
	is_boolean(b.bound)
}

admit_ok if {
	res := input.resource
	j := res.job
	t := j.tenant
	is_string(t)
	t != ""
	is_string(j.job_id)
	job_nodes := j.nodes
	is_array(job_nodes)
	count(job_nodes) > 0
	bindings := res.nodes
	is_array(bindings)
	count(binding_ids) == count(bindings)
	prefix := concat("", ["spiffe://", input.gateway.trust_domain, "/"])
	every n in job_nodes {
		is_string(n)
		startswith(n, prefix)
		n in binding_ids
	}
	now_ns < time_ns(j.expires_at)
	count(ns_facts) > 0
	count(scope_modes - {"ro", "rw"}) == 0
}

node_ids := {n.spiffe_id | some n in nodes}

admit_problems contains "request names no job" if not has_job_record

admit_problems contains sprintf("job %s has no tenant", [show_at(job, "job_id")]) if {
	has_job_record
	not non_empty(object.get(job, "tenant", null))
}

admit_problems contains sprintf("job %s names no nodes", [show_at(job, "job_id")]) if {
	has_job_record
	not job_has_nodes
}

job_has_nodes if {
	is_array(job.nodes)
	count(job.nodes) > 0
}

admit_problems contains p if some p in record_shape_problems("job", "job")

admit_problems contains p if some p in list_shape_problems("nodes", "binding")

admit_problems contains sprintf("node %v is not in trust domain %s", [n, input.gateway.trust_domain]) if {
	some n in job.nodes
	not startswith_string(n, concat("", ["spiffe://", input.gateway.trust_domain, "/"]))
}

admit_problems contains sprintf("node %v has no binding record", [n]) if {
	some n in job.nodes
	not n in node_ids
}

admit_problems contains "the node bindings name a node twice" if count(node_ids) != count(nodes)

# The other tenant is not named.
admit_problems contains sprintf("node %v is bound to another tenant", [show_at(n, "spiffe_id")]) if {
	details_visible
	some n in nodes
	has_key(n, "tenant")
	not n.tenant in {"", object.get(job, "tenant", null)}
}

admit_problems contains sprintf("the binding of node %v has no tenant", [show_at(n, "spiffe_id")]) if {
	some n in nodes
	not has_key(n, "tenant")
}

admit_problems contains "request time is not an RFC 3339 time" if not input_time_valid

admit_problems contains sprintf("job %s expires at %s, not after the request time", [show_at(job, "job_id"), job.expires_at]) if {
	expiry_ns <= now_ns
}

admit_problems contains sprintf("job %s names no namespaces", [show_at(job, "job_id")]) if {
	is_array(ns_list)
	count(ns_list) == 0
}

admit_problems contains sprintf("namespace %s has no access mode", [ns_label(ns)]) if {
	some ns in checked_namespaces
	not object.get(ns, "mode", null) in {"ro", "rw"}
}

# A global role that may admit (a site's choice) is still held to the job's
# tenant; schedulers are held to theirs by the tenant scope.
admit_problems contains sprintf("namespace %s is not in job %s's tenant", [ns_label(ns), show_at(job, "job_id")]) if {
	role_scope == "global"
	some ns in namespaces
	not ns.tenant == job.tenant
}

startswith_string(s, prefix) if {
	is_string(s)
	startswith(s, prefix)
}
