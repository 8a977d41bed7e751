package nvmegate.authz_test

# Job admission: the scheduler's tenant, the nodes' bindings, the expiry,
# the namespaces and their modes.

test_admit_allowed if {
	decide(admit({})) == {"allow": true, "reasons": ["role scheduler may perform jobs.admit for tenant acme"], "obligations": {}}
	allowed(decide(admit({"namespaces": [ns(1, {"mode": "ro"}), ns(2, {"mode": "rw", "data_class": "restricted"})]})))
}

test_admit_for_another_tenant_denied if {
	d := decide(admit({"tenant": "globex", "job": {"tenant": "globex"}, "namespaces": [ns(1, {"tenant": "globex", "mode": "rw"})]}))
	d.reasons == [
		"a scheduler of tenant acme may act only on tenant acme's resources",
		"job j1 is not in tenant acme",
		"namespace nqn.2026-01.org.example:acme-train/1 is not in tenant acme",
	]
	not leaks_globex(d)
}

test_admit_other_tenants_namespace_denied_without_details if {
	# ns 2 is globex's and also outside the job's regions: only the tenant
	# is named, nothing about its region or class.
	nss := [ns(1, {"mode": "rw"}), ns(2, {"tenant": "globex", "region": "us-east", "data_class": "immutable", "mode": "rw"})]
	d := decide(admit({"namespaces": nss}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/2 is not in tenant acme"]
}

test_admit_unknown_namespace_denied if {
	d := decide(admit({"namespaces": [{"subsystem_nqn": sub_nqn, "nsid": 9, "mode": "ro"}]}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/9 is not in tenant acme"]
}

test_admit_node_bound_to_another_tenant_denied if {
	nodes := [binding, {"spiffe_id": node2_id, "host_nqn": "nqn.x", "tenant": "globex", "bound": true}]
	d := decide(admit({"nodes": nodes}))
	d.reasons == ["node spiffe://example.org/node/gpu-02 is bound to another tenant"]
	not leaks_globex(d)
}

test_admit_nodes_need_binding_records if {
	d := decide(admit({"nodes": [binding]}))
	d.reasons == ["node spiffe://example.org/node/gpu-02 has no binding record"]
	d2 := decide(admit({"nodes": [binding, binding, object.union(binding, {"spiffe_id": node2_id})]}))
	d2.reasons == ["the node bindings name a node twice"]
	d3 := decide(admit({"nodes": [binding, {"spiffe_id": node2_id, "host_nqn": "nqn.x", "bound": false}]}))
	d3.reasons == ["the binding of node spiffe://example.org/node/gpu-02 has no tenant"]
	denied_with(decide(admit({"nodes": "gpu-01"})), "resource.nodes is not an array")
	denied_with(decide(admit({"nodes": ["gpu-01"]})), "resource.nodes[0] is not an object")
	denied_with(decide(admit({"nodes": [binding, object.union(binding, {"spiffe_id": node2_id, "bound": 1})]})), "resource.nodes[1].bound is not a boolean")
}

test_admit_nodes_of_the_trust_domain_only if {
	evil := "spiffe://evil.example/node/x"
	d := decide(admit({"job": {"nodes": [node.id, evil]}, "nodes": [binding, object.union(binding, {"spiffe_id": evil, "tenant": ""})]}))
	d.reasons == ["node spiffe://evil.example/node/x is not in trust domain example.org"]
	denied_with(decide(admit({"job": {"nodes": [node.id, 7]}})), "node 7 is not in trust domain example.org")
}

test_admit_needs_nodes if {
	denied_with(decide(admit({"job": {"nodes": []}})), "job j1 names no nodes")
	denied_with(decide(json.remove(admit({}), ["resource/job/nodes"])), "job j1 names no nodes")
}

test_admit_expiry if {
	decide(admit({"job": {"expires_at": "2026-10-01T12:00:00Z"}})).reasons == ["job j1 expires at 2026-10-01T12:00:00Z, not after the request time"]
	d := decide(admit({"job": {"expires_at": "next week"}}))
	d.reasons == ["resource.job.expires_at is not an RFC 3339 time"]
	denied_with(decide(object.union(admit({}), {"time": 0})), "request time is not an RFC 3339 time")
}

test_admit_needs_a_job if {
	denied_with(decide(json.remove(admit({}), ["resource/job"])), "request names no job")
	denied_with(decide(json.remove(admit({}), ["resource/job/tenant"])), "job j1 has no tenant")
}

test_admit_needs_namespaces_with_modes if {
	decide(admit({"namespaces": []})).reasons == ["job j1 names no namespaces"]
	decide(admit({"namespaces": [ns(1, {"mode": ""})]})).reasons == ["namespace nqn.2026-01.org.example:acme-train/1 has no access mode"]
	denied_with(decide(admit({"namespaces": [object.remove(ns(1, {}), ["mode"])]})), "namespace nqn.2026-01.org.example:acme-train/1 has no access mode")
}

test_admit_by_a_global_role_is_held_to_the_jobs_tenant if {
	roles := object.union(data.nvmegate.roles, {"admin": {"scope": "global", "actions": ["jobs.admit"]}})
	x := object.union(admit({}), {"caller": admin})
	decide(x).reasons == ["role admin may perform jobs.admit"] with data.nvmegate.roles as roles
	y := object.union(admit({"namespaces": [ns(1, {"mode": "rw"}), ns(2, {"tenant": "globex", "mode": "ro"})]}), {"caller": admin})
	decide(y).reasons == ["namespace nqn.2026-01.org.example:acme-train/2 is not in job j1's tenant"] with data.nvmegate.roles as roles
}

# A change of a job's nodes is decided as the admission of the job with its
# new node set: the scheduler's own tenant, every node bound to it or to no
# tenant.
update_nodes(patch) := object.union(admit(patch), {"action": "jobs.update_nodes", "rpc": {"method": "UpdateNodes", "full_method": "/nvmegate.v1.Jobs/UpdateNodes"}})

test_update_nodes_allowed if {
	d := decide(update_nodes({"job": {"state": "active"}}))
	d == {"allow": true, "reasons": ["role scheduler may perform jobs.update_nodes for tenant acme"], "obligations": {}}
}

test_update_nodes_to_another_tenants_node_denied if {
	other := object.union(binding, {"spiffe_id": node2_id, "tenant": "globex", "bound": true})
	d := decide(update_nodes({"job": {"state": "active"}, "nodes": [binding, other]}))
	d.reasons == ["node spiffe://example.org/node/gpu-02 is bound to another tenant"]
	not leaks_globex(d)
}

test_update_nodes_of_another_tenants_job_denied if {
	d := decide(update_nodes({"tenant": "globex", "job": {"tenant": "globex", "state": "active"}, "namespaces": [ns(1, {"tenant": "globex", "mode": "ro"})]}))
	not d.allow
	"a scheduler of tenant acme may act only on tenant acme's resources" in d.reasons
}
