package nvmegate.authz_test

# The decision document, the request's identity fields, and what each role
# may do (data.nvmegate.roles).

import data.nvmegate.authz

# --- The decision document ---------------------------------------------------

test_decision_defined_without_input if {
	d := authz.decision
	denied(d)
}

test_decision_with_empty_input if {
	d := decide({})
	d == {
		"allow": false,
		"reasons": [
			"caller has no SPIFFE ID",
			"caller has no role",
			"caller has no trust domain",
			"gateway trust domain is not set",
			"request has no resource description",
			"request names no RPC method",
			"request names no RPC service",
			"request names no action",
		],
		"obligations": {},
	}
}

test_decision_has_exactly_three_fields if {
	every x in [req(admin, "inventory.add_target", {}), req(node, "inventory.add_target", {}), connect({})] {
		object.keys(decide(x)) == {"allow", "reasons", "obligations"}
	}
}

test_non_object_inputs_denied if {
	every x in ["admin", 42, [], null, true] {
		denied(decide(x))
	}
}

test_allow_rule_agrees_with_decision if {
	authz.allow with input as connect({})
	not authz.allow with input as req(node, "inventory.add_target", {})
}

# --- Admins ----------------------------------------------------------------------

admin_actions := [
	"inventory.add_target", "inventory.list_namespaces", "inventory.remove_host_binding",
	"policy.explain", "policy.status", "keys.rotate", "keys.status",
	"audit.query", "audit.export", "audit.lineage",
	"jobs.get", "jobs.list", "jobs.finish", "access.list_grants", "access.revoke",
	"server_reflection.server_reflection_info",
]

test_admin_actions_allowed if {
	every a in admin_actions {
		d := decide(req(admin, a, {"kind": "none", "tenant": "acme"}))
		d == {"allow": true, "reasons": [sprintf("role admin may perform %s", [a])], "obligations": {}}
	}
}

test_admin_is_not_tenant_scoped if {
	allowed(decide(req(admin, "jobs.finish", {"kind": "job", "tenant": "globex", "job": object.union(job_rec, {"tenant": "globex"})})))
}

test_admin_denied_node_and_scheduler_actions if {
	every a in ["access.connect", "access.discover", "jobs.admit", "target.watch"] {
		decide(req(admin, a, {})).reasons == [sprintf("no rule allows role admin to perform %s", [a])]
	}
}

test_admin_wildcard_covers_future_methods if {
	allowed(decide(req(admin, "inventory.rename_target", {})))
}

# --- Auditors --------------------------------------------------------------------

test_auditor_reads_audit_and_policy_status if {
	every a in ["audit.query", "audit.checkpoint", "audit.inclusion_proof", "audit.consistency_proof", "audit.export", "audit.lineage", "policy.status"] {
		decide(req(auditor, a, {"kind": "audit", "tenant": ""})).reasons == [sprintf("role auditor may perform %s", [a])]
	}
}

test_auditor_denied_everything_else if {
	every a in ["policy.explain", "inventory.get_namespace", "keys.status", "jobs.get", "access.list_grants", "audit.prune"] {
		decide(req(auditor, a, {})).reasons == [sprintf("no rule allows role auditor to perform %s", [a])]
	}
}

# --- Health: any caller of the gateway's trust domain ------------------------------

test_health_for_every_role if {
	every c in [admin, auditor, scheduler, node, target_agent, gateway_peer, unknown] {
		every a in ["health.check", "health.watch", "health.list"] {
			d := decide(req(c, a, {"kind": "none", "tenant": ""}))
			d.reasons == [sprintf("any caller of trust domain example.org may perform %s", [a])]
			d.allow == true
		}
	}
}

test_health_foreign_trust_domain_denied if {
	c := object.union(node, {"id": "spiffe://other.example/node/gpu-01", "trust_domain": "other.example"})
	decide(req(c, "health.check", {})).reasons == ["caller trust domain other.example is not the gateway's trust domain example.org"]
}

test_open_actions_are_data if {
	d := decide(req(node, "health.check", {})) with data.nvmegate.authenticated_actions as []
	d.reasons == ["no rule allows role node to perform health.check"]
	allowed(decide(req(node, "audit.checkpoint", {}))) with data.nvmegate.authenticated_actions as ["audit.checkpoint"]
}

# --- Other roles -------------------------------------------------------------------

test_unknown_and_gateway_roles_get_nothing_but_health if {
	every c in [unknown, gateway_peer] {
		every a in ["inventory.get_target", "server_reflection.server_reflection_info", "access.connect", "audit.query"] {
			decide(req(c, a, {})).reasons == [sprintf("no rule allows role %s to perform %s", [c.role, a])]
		}
	}
}

test_role_name_is_case_sensitive if {
	c := object.union(admin, {"role": "Admin"})
	decide(req(c, "inventory.add_target", {})).reasons == ["no rule allows role Admin to perform inventory.add_target"]
}

# --- Roles are data --------------------------------------------------------------------

test_site_grants_by_data if {
	roles := object.union(data.nvmegate.roles, {"node": {"scope": "global", "actions": ["inventory.get_target"]}})
	d := decide(req(node, "inventory.get_target", {})) with data.nvmegate.roles as roles
	d.reasons == ["role node may perform inventory.get_target"]
	denied(decide(req(node, "inventory.add_target", {}))) with data.nvmegate.roles as roles
}

test_site_service_wildcard if {
	roles := {"auditor": {"scope": "global", "actions": ["keys.*"]}}
	allowed(decide(req(auditor, "keys.status", {}))) with data.nvmegate.roles as roles
	denied(decide(req(auditor, "audit.query", {}))) with data.nvmegate.roles as roles
}

test_unknown_scope_in_data_denies if {
	roles := {"admin": {"scope": "everywhere", "actions": ["inventory.*"]}}
	d := decide(req(admin, "inventory.add_target", {})) with data.nvmegate.roles as roles
	d.reasons == ["data error: role admin has unknown scope everywhere"]
}

test_no_roles_in_data_denies if {
	d := decide(req(admin, "inventory.add_target", {})) with data.nvmegate.roles as {}
	d.reasons == ["no rule allows role admin to perform inventory.add_target"]
}

# --- Identity and the request's own fields ------------------------------------------

test_foreign_trust_domain_denied if {
	c := object.union(admin, {"id": "spiffe://evil.example/admin/alice", "trust_domain": "evil.example"})
	decide(req(c, "inventory.add_target", {})).reasons == ["caller trust domain evil.example is not the gateway's trust domain example.org"]
}

test_id_outside_claimed_trust_domain_denied if {
	every id in ["spiffe://evil.example/admin/alice", "spiffe://example.org.evil/admin/alice", "spiffe://example.org", "example.org/admin/alice"] {
		c := object.union(admin, {"id": id})
		decide(req(c, "inventory.add_target", {})).reasons == ["caller SPIFFE ID is not in the caller's trust domain"]
	}
}

test_missing_or_garbled_identity_fields_denied if {
	every f in ["id", "trust_domain", "role"] {
		every v in ["", 1, true, null, ["admin"], {"admin": true}] {
			denied(decide(req(object.union(admin, {f: v}), "health.check", {})))
		}
	}
	denied_with(decide(req(object.union(admin, {"role": ""}), "health.check", {})), "caller has no role")
	denied_with(decide(req(object.remove(admin, ["id"]), "health.check", {})), "caller has no SPIFFE ID")
}

test_missing_caller_rpc_gateway_denied if {
	base := req(admin, "inventory.add_target", {})
	decide(object.remove(base, ["caller"])).reasons == ["caller has no SPIFFE ID", "caller has no role", "caller has no trust domain"]
	decide(object.remove(base, ["rpc"])).reasons == ["request names no RPC method", "request names no RPC service"]
	decide(json.remove(base, ["rpc/method"])).reasons == ["request names no RPC method"]
	decide(object.remove(base, ["gateway"])).reasons == ["gateway trust domain is not set"]
	every patch in [{"caller": "admin"}, {"caller": null}, {"rpc": ["nvmegate.v1.Inventory", "AddTarget"]}, {"gateway": "example.org"}] {
		denied(decide(object.union(base, patch)))
	}
}

test_action_required_and_well_formed if {
	base := req(admin, "inventory.add_target", {})
	decide(object.remove(base, ["action"])).reasons == ["request names no action"]
	every a in ["Inventory.AddTarget", "inventory", "inventory.add_target.x", "inventory.*", " inventory.add_target"] {
		decide(object.union(base, {"action": a})).reasons == [sprintf("request action %s is not of the form service.method", [a])]
	}
	decide(object.union(base, {"action": 7})).reasons == ["request names no action"]
}

test_resource_must_be_an_object if {
	every r in [null, "x", [], 1] {
		decide(req(admin, "inventory.add_target", r)).reasons == ["request has no resource description"]
	}
	decide(object.remove(req(admin, "health.check", {}), ["resource"])).reasons == ["request has no resource description"]
}

test_deny_always_has_a_reason if {
	# Were the reasons of a failed check ever missing, the deny says so.
	d := decide(connect({"job": {"state": "finished"}})) with authz.problems as set()
	d.reasons == ["request is outside the scope of role node"]
}

test_accessors_are_total if {
	authz.resource == {} with input as {"resource": 1}
	authz.job == {} with input as {"resource": {"job": "j1"}}
	authz.namespaces == [] with input as {"resource": {"namespaces": "x"}}
	authz.nodes == [] with input as {"resource": {}}
}

test_helpers if {
	authz.show_at({"a": 1}, "a") == "1"
	authz.show_at({}, "a") == "<missing>"
	authz.has_key({"a": false}, "a")
	not authz.has_key({"a": false}, "b")
	not authz.string_at(["x"]) with input as "x"
}
