package nvmegate.authz_test

# Connect and renew in parts (connect.rego): the scope decision (no caller,
# no time), the caller decision (no time) and the node decision.

import data.nvmegate.authz

scope_of(x) := d if {
	si := authz.scope_input with input as x
	d := authz.scope_decision with input as si
}

parts(x) := p if {
	p := authz.split_parts with input as x
}

# --- The scope decision -----------------------------------------------------------------

test_scope_input_holds_no_caller_and_no_time if {
	si := authz.scope_input with input as connect({})
	object.keys(si) == {"action", "resource"}
	object.keys(si.resource) == {"tenant", "target", "subsystem", "namespaces", "job", "request"}
	si.resource.job == {"job_id": "j1", "tenant": "acme", "allowed_regions": ["eu-west"]}
	si.resource.request == {"mode": ""}

	# A record that is not an object is kept as it is, for the reasons.
	si2 := authz.scope_input with input as connect({"job": "j1"})
	si2.resource.job == "j1"
}

test_scope_decision_allows_with_the_obligations if {
	scope_of(connect({})) == {"allow": true, "reasons": [], "obligations": {"max_ttl": "24h", "read_only": true}}
}

test_scope_decision_is_the_same_for_every_caller_and_time if {
	s := scope_of(connect({}))
	scope_of(object.union(connect({}), {"caller": node2_caller, "time": "2030-01-01T00:00:00Z"})) == s
	scope_of(connect({"host_binding": {"tenant": "globex"}, "job": {"state": "finished", "nodes": []}})) == s
}

node2_caller := caller("node", "/node/gpu-02", "", "gpu-02")

test_scope_decision_reasons if {
	r := "namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-east"
	scope_of(connect({"namespaces": [ns(1, {"target": {"id": "t1", "region": "us-east", "fabric": "f1"}})]})) == {"allow": false, "reasons": [r], "obligations": {}}
	scope_of(connect({"subsystem": {"tenant": "globex"}})).reasons == ["subsystem nqn.2026-01.org.example:acme-train is not in job j1's tenant"]
	"job j1 has no tenant" in scope_of(json.remove(connect({}), ["resource/job/tenant"])).reasons
	scope_of(connect({"request": {"mode": "write"}})).reasons == [`resource.request.mode is not "", "ro" or "rw"`]
}

test_scope_decision_always_gives_a_reason if {
	d := scope_of(connect({"tenant": "globex"})) with authz.scope_decision_problems as set()
	d == {"allow": false, "reasons": ["request is outside the scope of job j1"], "obligations": {}}
}

# --- The caller decision ----------------------------------------------------------------

caller_of(x) := d if {
	ci := authz.caller_input with input as x
	d := authz.caller_decision with input as object.union(ci, {"scope_decision": scope_of(x)})
}

test_caller_input_holds_no_time_and_no_scope_records if {
	ci := authz.caller_input with input as connect({})
	object.keys(ci) == {"caller", "rpc", "action", "resource", "gateway"}
	not ci.resource.namespaces
	not ci.resource.subsystem
	ci.resource.host_binding == binding
	ci2 := authz.caller_input with input as object.union(connect({}), {"resource": "x"})
	ci2.resource == "x"
}

test_caller_decision_of_a_node if {
	caller_of(connect({})) == {
		"allow": true,
		"grant": {"allow": true, "reasons": ["role node may perform access.connect in job j1"], "obligations": {"max_ttl": "24h", "read_only": true}},
		"until_ns": time.parse_rfc3339_ns("2026-10-02T00:00:00Z"),
	}
	caller_of(connect({"host_binding": {"tenant": "globex"}})) == {"allow": false}
	caller_of(connect({"job": {"state": "finished"}})) == {"allow": false}
	caller_of(connect({"job": {"expires_at": "tomorrow"}})) == {"allow": false}

	# The scope's deny is the caller's too.
	caller_of(connect({"subsystem": {"tenant": "globex"}})) == {"allow": false}
}

# Roles of every scope may be granted a connect by data: global and tenant
# roles get the scope's obligations and no expiry, target agents and open
# actions no obligations.
test_caller_decision_of_other_scopes if {
	roles := object.union(data.nvmegate.roles, {
		"admin": {"scope": "global", "actions": ["access.connect"]},
		"scheduler": {"scope": "tenant", "actions": ["access.connect"]},
		"target": {"scope": "target", "actions": ["access.*"]},
	})
	ob := {"max_ttl": "24h", "read_only": true}
	d1 := decide(object.union(connect({}), {"caller": admin})) with data.nvmegate.roles as roles
	d1 == {"allow": true, "reasons": ["role admin may perform access.connect"], "obligations": ob}
	d2 := decide(object.union(connect({}), {"caller": scheduler})) with data.nvmegate.roles as roles
	d2 == {"allow": true, "reasons": ["role scheduler may perform access.connect for tenant acme"], "obligations": ob}
	d3 := decide(object.union(connect({}), {"caller": globex_scheduler})) with data.nvmegate.roles as roles
	d3.allow == false
	d4 := decide(object.union(connect({}), {"caller": target_agent})) with data.nvmegate.roles as roles
	d4 == {"allow": true, "reasons": ["role target may perform access.connect on target t1"], "obligations": {}}

	# A global role is still held to the scope.
	d5 := decide(object.union(connect({"subsystem": {"tls": false, "dhchap": false}, "namespaces": [ns(1, {"data_class": "restricted"})]}), {"caller": admin})) with data.nvmegate.roles as roles
	d5.reasons == ["subsystem nqn.2026-01.org.example:acme-train supports no authentication option of data class restricted"]

	d6 := decide(object.union(connect({}), {"caller": unknown})) with data.nvmegate.authenticated_actions as ["access.connect"]
	d6 == {"allow": true, "reasons": ["any caller of trust domain example.org may perform access.connect"], "obligations": {}}
}

# --- The node decision ------------------------------------------------------------------

node_of(x, caller_doc, scope_doc) := d if {
	doc := object.union(x, {"caller_decision": caller_doc, "scope_decision": scope_doc, "time_ns": time.parse_rfc3339_ns(x.time)})
	d := authz.node_decision with input as doc
}

grant_doc := {"allow": true, "reasons": ["role node may perform access.connect in job j1"], "obligations": {"max_ttl": "1h"}}

granted := {"allow": true, "grant": grant_doc, "until_ns": time.parse_rfc3339_ns("2026-10-02T00:00:00Z")}

scope_ok := {"allow": true, "reasons": [], "obligations": {"max_ttl": "1h"}}

test_node_decision_in_time if {
	node_of(connect({}), granted, scope_ok) == grant_doc
	late := object.union(connect({}), {"time": "2026-10-02T00:00:00Z"})
	node_of(late, granted, scope_ok) == {"allow": false, "reasons": ["job j1 expired at 2026-10-02T00:00:00Z"], "obligations": {}}
}

test_node_decision_needs_the_request_time if {
	x := object.union(connect({}), {"caller_decision": granted, "scope_decision": scope_ok, "time": "now"})
	d := authz.node_decision with input as x
	d == {"allow": false, "reasons": ["request time is not an RFC 3339 time"], "obligations": {}}
}

test_node_decision_gives_the_scope_reasons_to_members_only if {
	scope_no := {"allow": false, "reasons": ["namespace x is not in job j1's tenant"], "obligations": {}}
	node_of(connect({}), {"allow": false}, scope_no).reasons == ["namespace x is not in job j1's tenant"]
	outsider := connect({"job": {"nodes": [node2_id]}})
	node_of(outsider, {"allow": false}, scope_no).reasons == ["node spiffe://example.org/node/gpu-01 is not in the scope of job j1"]
}

test_node_decision_without_expiry if {
	untimed := {"allow": true, "grant": {"allow": true, "reasons": ["r"], "obligations": {}}}
	node_of(connect({}), untimed, scope_ok) == {"allow": true, "reasons": ["r"], "obligations": {}}
}

test_grant_obligations if {
	authz.grant_obligations({"scoped": true}) == {"max_ttl": "1h"} with input.scope_decision as scope_ok
	authz.grant_obligations({"scoped": false}) == {} with input.scope_decision as scope_ok
	not authz.grant_obligations({"scoped": true}) with input.scope_decision as {"allow": false}
}

# --- All parts ---------------------------------------------------------------------------

test_split_parts if {
	p := parts(connect({}))
	object.keys(p) == {"scope_input", "scope_decision", "caller_decision", "node_decision"}
	p.node_decision == decide(connect({}))
	p.node_decision.allow
	decide(node_call("access.renew", {})).reasons == ["role node may perform access.renew in job j1"]
	authz.allow with input as node_call("access.renew", {})
}
