package nvmegate.authz_test

import data.nvmegate.authz

# --- Fixtures ---------------------------------------------------------------

td := "example.org"

caller(role, path) := {
	"id": concat("", ["spiffe://", td, path]),
	"trust_domain": td,
	"role": role,
	"tenant": "",
	"name": "x",
}

req(c, service, method) := {
	"caller": c,
	"rpc": {
		"service": service,
		"method": method,
		"full_method": concat("", ["/", service, "/", method]),
	},
	"action": "test.action",
	"resource": {},
	"time": "2026-10-01T12:00:00Z",
	"gateway": {"trust_domain": td},
}

admin := caller("admin", "/admin/alice")

node := caller("node", "/node/gpu-01")

auditor := caller("auditor", "/auditor/eve")

scheduler := object.union(caller("scheduler", "/tenant/acme/scheduler/slurm"), {"tenant": "acme"})

target := caller("target", "/target/t1")

unknown := caller("unknown", "/workload/foo")

decide(input_doc) := d if {
	d := authz.decision with input as input_doc
}

allowed(d) if {
	d.allow == true
	count(d.reasons) > 0
	d.obligations == {}
}

denied_with(d, reason) if {
	d.allow == false
	reason in d.reasons
}

# --- The decision document ---------------------------------------------------

test_decision_defined_without_input if {
	d := authz.decision
	d.allow == false
	count(d.reasons) > 0
	is_object(d.obligations)
}

test_decision_defined_with_empty_input if {
	d := decide({})
	d.allow == false
	d.reasons == [
		"caller has no SPIFFE ID",
		"caller has no role",
		"caller has no trust domain",
		"gateway trust domain is not set",
		"request names no RPC method",
		"request names no RPC service",
	]
}

test_decision_has_exactly_three_fields if {
	d := decide(req(admin, "nvmegate.v1.Inventory", "AddTarget"))
	object.keys(d) == {"allow", "reasons", "obligations"}
}

# --- Admin: Inventory, Policy, reflection -------------------------------------

test_admin_may_call_inventory if {
	d := decide(req(admin, "nvmegate.v1.Inventory", "AddTarget"))
	allowed(d)
	d.reasons == ["role admin may call nvmegate.v1.Inventory"]
}

test_admin_may_call_every_inventory_method if {
	every m in ["AddTarget", "ListNamespaces", "DeleteSubsystem", "AnyFutureMethod"] {
		allowed(decide(req(admin, "nvmegate.v1.Inventory", m)))
	}
}

test_admin_may_call_policy if {
	d := decide(req(admin, "nvmegate.v1.Policy", "Explain"))
	allowed(d)
	d.reasons == ["role admin may call nvmegate.v1.Policy"]
}

test_admin_may_use_reflection if {
	every s in ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"] {
		allowed(decide(req(admin, s, "ServerReflectionInfo")))
	}
}

test_admin_denied_other_services if {
	d := decide(req(admin, "nvmegate.v1.Access", "Connect"))
	d.allow == false
	d.reasons == ["no rule allows role admin to call nvmegate.v1.Access/Connect"]
}

test_admin_of_foreign_trust_domain_denied if {
	c := object.union(admin, {"id": "spiffe://evil.example/admin/alice", "trust_domain": "evil.example"})
	d := decide(req(c, "nvmegate.v1.Inventory", "AddTarget"))
	d.allow == false
	d.reasons == ["caller trust domain evil.example is not the gateway's trust domain example.org"]
}

test_admin_id_outside_claimed_trust_domain_denied if {
	c := object.union(admin, {"id": "spiffe://evil.example/admin/alice"})
	d := decide(req(c, "nvmegate.v1.Inventory", "AddTarget"))
	d.reasons == ["caller SPIFFE ID is not in the caller's trust domain"]
	d.allow == false
}

test_admin_id_with_trust_domain_prefix_denied if {
	# "spiffe://example.org.evil/..." starts with "spiffe://example.org"
	c := object.union(admin, {"id": "spiffe://example.org.evil/admin/alice"})
	denied_with(decide(req(c, "nvmegate.v1.Inventory", "AddTarget")), "caller SPIFFE ID is not in the caller's trust domain")
}

# --- Other roles: no inventory or policy ----------------------------------

test_other_roles_denied_inventory_and_policy if {
	every c in [node, auditor, scheduler, target, unknown] {
		every s in ["nvmegate.v1.Inventory", "nvmegate.v1.Policy", "grpc.reflection.v1.ServerReflection"] {
			d := decide(req(c, s, "M"))
			d.allow == false
			d.reasons == [sprintf("no rule allows role %s to call %s/M", [c.role, s])]
		}
	}
}

test_node_denied_add_target_reason if {
	d := decide(req(node, "nvmegate.v1.Inventory", "AddTarget"))
	d == {
		"allow": false,
		"reasons": ["no rule allows role node to call nvmegate.v1.Inventory/AddTarget"],
		"obligations": {},
	}
}

test_role_name_is_case_sensitive if {
	c := object.union(admin, {"role": "Admin"})
	denied_with(
		decide(req(c, "nvmegate.v1.Inventory", "AddTarget")),
		"no rule allows role Admin to call nvmegate.v1.Inventory/AddTarget",
	)
}

test_service_name_must_match_exactly if {
	every s in ["nvmegate.v1.inventory", "nvmegate.v2.Inventory", "nvmegate.v1.Inventory ", ""] {
		decide(req(admin, s, "AddTarget")).allow == false
	}
}

# --- Health: any caller of the gateway's trust domain ---------------------

test_health_any_role_of_own_trust_domain if {
	every c in [admin, node, auditor, scheduler, target, unknown] {
		d := decide(req(c, "grpc.health.v1.Health", "Check"))
		allowed(d)
		d.reasons == ["any caller of trust domain example.org may call grpc.health.v1.Health"]
	}
}

test_health_watch_allowed if {
	allowed(decide(req(node, "grpc.health.v1.Health", "Watch")))
}

test_health_foreign_trust_domain_denied if {
	c := object.union(node, {"id": "spiffe://other.example/node/gpu-01", "trust_domain": "other.example"})
	d := decide(req(c, "grpc.health.v1.Health", "Check"))
	d.allow == false
	d.reasons == ["caller trust domain other.example is not the gateway's trust domain example.org"]
}

test_admin_health_granted_by_trust_domain_rule if {
	# admin is not granted Health by role, only by the trust-domain rule
	d := decide(req(admin, "grpc.health.v1.Health", "Check"))
	d.reasons == ["any caller of trust domain example.org may call grpc.health.v1.Health"]
}

# --- Missing or garbled fields deny -------------------------------------------

test_missing_caller_denied if {
	d := decide(object.remove(req(admin, "grpc.health.v1.Health", "Check"), ["caller"]))
	d.allow == false
	d.reasons == ["caller has no SPIFFE ID", "caller has no role", "caller has no trust domain"]
}

test_missing_caller_fields_denied if {
	every f in ["id", "trust_domain", "role"] {
		d := decide(req(object.remove(admin, [f]), "nvmegate.v1.Inventory", "AddTarget"))
		d.allow == false
		count(d.reasons) > 0
	}
}

test_empty_or_non_string_caller_fields_denied if {
	every f in ["id", "trust_domain", "role"] {
		every v in ["", 1, true, null, ["admin"], {"admin": true}] {
			d := decide(req(object.union(admin, {f: v}), "grpc.health.v1.Health", "Check"))
			d.allow == false
			count(d.reasons) > 0
		}
	}
}

test_empty_role_denied_with_reason if {
	denied_with(decide(req(object.union(admin, {"role": ""}), "grpc.health.v1.Health", "Check")), "caller has no role")
}

test_missing_gateway_trust_domain_denied if {
	every doc in [
		object.remove(req(node, "grpc.health.v1.Health", "Check"), ["gateway"]),
		object.union(req(node, "grpc.health.v1.Health", "Check"), {"gateway": {"trust_domain": ""}}),
	] {
		denied_with(decide(doc), "gateway trust domain is not set")
	}
}

test_missing_rpc_denied if {
	d := decide(object.remove(req(admin, "nvmegate.v1.Inventory", "AddTarget"), ["rpc"]))
	d.allow == false
	d.reasons == ["request names no RPC method", "request names no RPC service"]
}

test_missing_rpc_method_denied if {
	doc := json.remove(req(admin, "nvmegate.v1.Inventory", "AddTarget"), ["rpc/method"])
	d := decide(doc)
	d.reasons == ["request names no RPC method"]
	d.allow == false
}

test_non_object_input_denied if {
	every doc in ["admin", 42, [], null] {
		d := decide(doc)
		d.allow == false
		count(d.reasons) > 0
	}
}

# --- Tables stay plain JSON (they move to data later) ----------------------

test_tables_are_json if {
	json.unmarshal(json.marshal(authz.role_permissions)) == authz.role_permissions
	json.unmarshal(json.marshal(authz.authenticated_services)) == authz.authenticated_services
}

test_non_object_caller_rpc_or_gateway_denied if {
	base := req(admin, "nvmegate.v1.Inventory", "AddTarget")
	every patch in [{"caller": "admin"}, {"caller": null}, {"rpc": ["nvmegate.v1.Inventory", "AddTarget"]}, {"gateway": "example.org"}] {
		d := decide(object.union(base, patch))
		d.allow == false
		count(d.reasons) > 0
	}
}
