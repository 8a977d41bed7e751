package nvmegate.authz_test

# Scopes: schedulers act for their tenant only, nodes within an active job
# that names them with their own binding, target agents on their target.

# --- Schedulers: tenant isolation ----------------------------------------------------

own_job_read := req(scheduler, "jobs.get", {"kind": "job", "tenant": "acme", "job": job_rec})

globex_job := object.union(job_rec, {"job_id": "j9", "tenant": "globex"})

test_scheduler_reads_its_tenants_jobs if {
	decide(own_job_read) == {"allow": true, "reasons": ["role scheduler may perform jobs.get for tenant acme"], "obligations": {}}
	every a in ["jobs.get", "jobs.finish"] {
		allowed(decide(object.union(own_job_read, {"action": a})))
	}
	allowed(decide(req(scheduler, "jobs.list", {"kind": "job", "tenant": "acme"})))
}

test_scheduler_denied_other_tenants_job if {
	d := decide(req(scheduler, "jobs.get", {"kind": "job", "tenant": "globex", "job": globex_job}))
	d.reasons == ["a scheduler of tenant acme may act only on tenant acme's resources", "job j9 is not in tenant acme"]
	not leaks_globex(d)
}

# Another tenant's job and a job that does not exist (the gateway describes
# it by its ID alone) are refused with the same reasons: a scheduler cannot
# probe other tenants' job IDs. The same for subsystems.
test_scheduler_denied_unknown_job_like_a_foreign_one if {
	foreign := decide(req(scheduler, "jobs.get", {"kind": "job", "tenant": "globex", "job": object.union(globex_job, {"job_id": "j9"})}))
	unknown := decide(req(scheduler, "jobs.get", {"kind": "job", "tenant": "", "job": {"job_id": "j9"}}))
	foreign.reasons == unknown.reasons
	unknown.reasons == ["a scheduler of tenant acme may act only on tenant acme's resources", "job j9 is not in tenant acme"]
	every a in ["jobs.finish"] {
		decide(req(scheduler, a, {"kind": "job", "tenant": "globex", "job": globex_job})).reasons == decide(req(scheduler, a, {"kind": "job", "tenant": "", "job": {"job_id": "j9"}})).reasons
	}
	sub_foreign := decide(req(scheduler, "inventory.get_subsystem", {"kind": "subsystem", "tenant": "globex", "subsystem": object.union(subsystem_rec, {"tenant": "globex"})}))
	sub_unknown := decide(req(scheduler, "inventory.get_subsystem", {"kind": "subsystem", "tenant": "", "subsystem": {"nqn": sub_nqn}}))
	sub_foreign.reasons == sub_unknown.reasons
	denied(sub_unknown)
}

test_scheduler_denied_unscoped_list if {
	d := decide(req(scheduler, "jobs.list", {"kind": "job", "tenant": ""}))
	d.reasons == ["a scheduler of tenant acme may act only on tenant acme's resources"]
	denied(decide(req(scheduler, "jobs.list", {"kind": "job"})))
}

test_scheduler_denied_job_of_other_tenant_even_if_resource_tenant_matches if {
	d := decide(req(scheduler, "jobs.finish", {"kind": "job", "tenant": "acme", "job": globex_job}))
	d.reasons == ["job j9 is not in tenant acme"]
}

test_scheduler_reads_its_namespaces if {
	x := req(scheduler, "inventory.get_namespace", {"kind": "namespace", "tenant": "acme", "subsystem": subsystem_rec, "namespaces": [ns(1, {"mode": ""})]})
	decide(x).reasons == ["role scheduler may perform inventory.get_namespace for tenant acme"]
	allowed(decide(object.union(x, {"action": "inventory.get_subsystem"})))
	allowed(decide(req(scheduler, "inventory.list_namespaces", {"kind": "namespace", "tenant": "acme"})))
}

test_scheduler_denied_other_tenants_namespace if {
	x := req(scheduler, "inventory.get_namespace", {
		"kind": "namespace", "tenant": "globex",
		"subsystem": object.union(subsystem_rec, {"tenant": "globex"}),
		"namespaces": [ns(1, {"tenant": "globex", "mode": ""})],
	})
	d := decide(x)
	d.reasons == [
		"a scheduler of tenant acme may act only on tenant acme's resources",
		"namespace nqn.2026-01.org.example:acme-train/1 is not in tenant acme",
	]
	not leaks_globex(d)

	# The same reasons as for a namespace that does not exist (described
	# by its key alone, without a subsystem).
	unknown := req(scheduler, "inventory.get_namespace", {"kind": "namespace", "tenant": "", "namespaces": [{"subsystem_nqn": sub_nqn, "nsid": 1}]})
	decide(unknown).reasons == d.reasons

	# The caller's own namespace on another tenant's subsystem still names
	# the subsystem (nothing about a foreign record's existence in it).
	own := req(scheduler, "inventory.get_namespace", {
		"kind": "namespace", "tenant": "acme",
		"subsystem": object.union(subsystem_rec, {"tenant": "globex"}),
		"namespaces": [ns(1, {"mode": ""})],
	})
	decide(own).reasons == ["subsystem nqn.2026-01.org.example:acme-train is not in tenant acme"]
}

test_scheduler_denied_unknown_namespace_like_a_foreign_one if {
	# The gateway describes a namespace it cannot find by its key alone.
	x := req(scheduler, "inventory.get_namespace", {"kind": "namespace", "tenant": "", "namespaces": [{"subsystem_nqn": sub_nqn, "nsid": 7}]})
	decide(x).reasons == [
		"a scheduler of tenant acme may act only on tenant acme's resources",
		"namespace nqn.2026-01.org.example:acme-train/7 is not in tenant acme",
	]
}

test_scheduler_denied_mixed_namespaces if {
	x := req(scheduler, "inventory.get_namespace", {"kind": "namespace", "tenant": "acme", "namespaces": [ns(1, {}), ns(2, {"tenant": "globex"})]})
	decide(x).reasons == ["namespace nqn.2026-01.org.example:acme-train/2 is not in tenant acme"]
}

test_scheduler_garbled_namespaces_denied if {
	x := req(scheduler, "inventory.get_namespace", {"kind": "namespace", "tenant": "acme", "namespaces": "ns1"})
	decide(x).reasons == ["resource.namespaces is not an array"]
}

test_scheduler_without_tenant_denied if {
	c := object.union(scheduler, {"tenant": ""})
	decide(req(c, "jobs.list", {"kind": "job", "tenant": ""})).reasons == ["role scheduler has no tenant"]
	d := decide(req(object.remove(scheduler, ["tenant"]), "jobs.list", {"kind": "job", "tenant": "acme"}))
	denied_with(d, "role scheduler has no tenant")
}

test_scheduler_denied_admin_actions if {
	every a in ["inventory.add_namespace", "inventory.get_target", "policy.explain", "access.connect", "access.revoke", "keys.rotate"] {
		decide(req(scheduler, a, {"kind": "none", "tenant": "acme"})).reasons == [sprintf("no rule allows role scheduler to perform %s", [a])]
	}
}

leaks_globex(d) if {
	some r in d.reasons
	contains(r, "globex")
}

# --- Nodes: job scope ---------------------------------------------------------------------

test_node_actions_within_its_job if {
	d := decide(connect({}))
	d.allow
	d.reasons == ["role node may perform access.connect in job j1"]
	every a in ["access.discover", "access.renew", "access.release"] {
		decide(node_call(a, {})).reasons == [sprintf("role node may perform %s in job j1", [a])]
	}
}

test_node_release_needs_no_namespaces if {
	allowed(decide(node_call("access.release", {"namespaces": [], "subsystem": null})))
	allowed(decide(req(node, "access.release", {"kind": "grant", "tenant": "acme", "job": job_rec, "host_binding": binding})))
}

test_node_not_in_job_learns_nothing_else if {
	other := {"nodes": [node2_id], "tenant": "globex", "state": "finished", "expires_at": "2026-01-01T00:00:00Z", "allowed_regions": ["us-east"]}
	d := decide(connect({"job": other}))
	d.reasons == ["node spiffe://example.org/node/gpu-01 is not in the scope of job j1"]
}

test_node_request_names_no_job if {
	decide(json.remove(connect({}), ["resource/job"])).reasons == ["request names no job"]
	decide(connect({"job": "j1"})).reasons == ["request names no job", "resource.job is not an object"]
}

test_node_denied_inactive_or_expired_job if {
	decide(connect({"job": {"state": "finished"}})).reasons == ["job j1 is not active (state finished)"]
	decide(connect({"job": {"state": "expired"}})).reasons == ["job j1 is not active (state expired)"]
	decide(connect({"job": {"expires_at": "2026-10-01T11:59:59Z"}})).reasons == ["job j1 expired at 2026-10-01T11:59:59Z"]
	decide(connect({"job": {"expires_at": "2026-10-01T12:00:00Z"}})).reasons == ["job j1 expired at 2026-10-01T12:00:00Z"]
	allowed(decide(connect({"job": {"expires_at": "2026-10-01T12:00:00.000000001Z"}})))
	denied(decide(connect({"job": {"expires_at": "2026-10-01T13:00:00+01:00"}})))
	allowed(decide(connect({"job": {"expires_at": "2026-10-01T13:00:01+01:00"}})))
}

test_node_denied_job_without_valid_expiry if {
	every e in ["tomorrow", "2026-02-30T00:00:00Z", 1790000000, null] {
		denied_with(decide(connect({"job": {"expires_at": e}})), "job j1 has no valid expiry")
	}
	decide(json.remove(connect({}), ["resource/job/expires_at"])).reasons == ["job j1 has no valid expiry"]
}

test_node_denied_without_request_time if {
	denied_with(decide(object.remove(connect({}), ["time"])), "request time is not an RFC 3339 time")
	denied_with(decide(object.union(connect({}), {"time": "now"})), "request time is not an RFC 3339 time")
}

test_node_denied_job_without_tenant if {
	denied_with(decide(json.remove(connect({}), ["resource/job/tenant"])), "job j1 has no tenant")
	denied_with(decide(connect({"job": {"tenant": ""}})), "job j1 has no tenant")
}

test_node_uses_its_own_binding if {
	d := decide(connect({"host_binding": {"spiffe_id": node2_id}}))
	d.reasons == ["host binding is not the caller's"]
	denied_with(decide(json.remove(connect({}), ["resource/host_binding"])), "request has no host binding for the caller")
	denied_with(decide(connect({"host_binding": {"host_nqn": ""}})), "host binding has no host NQN")
	decide(connect({"host_binding": {"host_nqn": ""}, "request": {"host_nqn": ""}})).reasons == ["host binding has no host NQN"]
}

test_node_may_not_ask_for_another_host_nqn if {
	d := decide(connect({"request": {"host_nqn": "nqn.2014-08.org.nvmexpress:uuid:ffffffff-0000-5000-8000-000000000000"}}))
	d.reasons == ["host NQN nqn.2014-08.org.nvmexpress:uuid:ffffffff-0000-5000-8000-000000000000 is not bound to node spiffe://example.org/node/gpu-01"]
	allowed(decide(connect({"request": {"host_nqn": ""}})))
	allowed(decide(json.remove(connect({}), ["resource/request"])))
}

test_node_bound_to_another_tenant_denied if {
	decide(connect({"host_binding": {"tenant": "globex"}})).reasons == ["node spiffe://example.org/node/gpu-01 is bound to a tenant other than job j1's"]

	# Unbound (the derived default NQN) and bound without a tenant may
	# serve any tenant's jobs that name them.
	allowed(decide(connect({"host_binding": {"tenant": "", "bound": false}})))
	allowed(decide(connect({"host_binding": {"tenant": ""}})))
}

test_node_denied_other_tenants_records if {
	decide(connect({"tenant": "globex"})).reasons == ["request concerns a tenant other than job j1's"]
	decide(connect({"subsystem": {"tenant": "globex"}})).reasons == ["subsystem nqn.2026-01.org.example:acme-train is not in job j1's tenant"]
	d := decide(connect({"namespaces": [ns(1, {}), ns(2, {"tenant": "globex"})]}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/2 is not in job j1's tenant"]
	d2 := decide(node_call("access.release", {"namespaces": [ns(2, {"tenant": "globex"})]}))
	d2.reasons == ["namespace nqn.2026-01.org.example:acme-train/2 is not in job j1's tenant"]
}

test_node_denied_other_actions if {
	every a in ["jobs.admit", "jobs.get", "inventory.add_target", "access.revoke", "access.list_grants", "audit.query"] {
		decide(req(node, a, {})).reasons == [sprintf("no rule allows role node to perform %s", [a])]
	}
}

test_node_garbled_job_records_denied if {
	denied_with(decide(connect({"job": {"nodes": node.id}})), "node spiffe://example.org/node/gpu-01 is not in the scope of job j1")
	d := decide(connect({"job": {"state": 1}}))
	denied_with(d, "resource.job.state is not a string")
	denied_with(decide(connect({"host_binding": {"bound": "yes"}})), "resource.host_binding.bound is not a boolean")
	denied_with(decide(connect({"request": {"mode": "write"}})), `resource.request.mode is not "", "ro" or "rw"`)
	denied_with(decide(connect({"request": "x"})), "resource.request is not an object")
	denied_with(decide(connect({"host_binding": "x"})), "request has no host binding for the caller")
}

# --- Target agents --------------------------------------------------------------------------

test_target_agent_on_its_own_target if {
	d := decide(req(target_agent, "target.watch", {"kind": "target", "tenant": "", "target": target_rec}))
	d.reasons == ["role target may perform target.watch on target t1"]
	every r in [{"kind": "target", "target": object.union(target_rec, {"id": "t2"})}, {"kind": "none"}, {"target": "t1"}] {
		decide(req(target_agent, "target.watch", r)).reasons == ["target agent t1 may act only on its own target"]
	}
	d2 := decide(req(object.union(target_agent, {"name": ""}), "target.watch", {"target": object.union(target_rec, {"id": ""})}))
	d2.reasons == ["target agent  may act only on its own target"]
}

test_target_agent_denied_other_actions if {
	decide(req(target_agent, "access.connect", connect({}).resource)).reasons == ["no rule allows role target to perform access.connect"]
}
