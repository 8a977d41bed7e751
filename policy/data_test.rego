package nvmegate.authz_test

# The checks of data.nvmegate the engine runs once per revision, and the
# self-test samples (selftest.json, which opa test loads as data.samples).

import data.nvmegate.authz

test_shipped_data_has_no_problems if {
	authz.data_problems == set()
	authz.load_check.problems == set()
	count(authz.load_check.derived.obligations) == 15
}

problems_with("roles", v) := p if {
	p := authz.data_problems with data.nvmegate.roles as v
}

problems_with("authenticated_actions", v) := p if {
	p := authz.data_problems with data.nvmegate.authenticated_actions as v
}

problems_with("classes", v) := p if {
	p := authz.data_problems with data.nvmegate.classes as v
}

problems_with("default_obligations", v) := p if {
	p := authz.data_problems with data.nvmegate.default_obligations as v
}

problems_with("residency", v) := p if {
	p := authz.data_problems with data.nvmegate.residency as v
}

problems_with("derived", v) := p if {
	p := authz.data_problems with data.nvmegate.derived as v
}

test_role_problems if {
	problems_with("roles", []) == {"data.nvmegate.roles is not an object"}
	problems_with("roles", {"admin": "all"}) == {"role admin is not an object"}
	problems_with("roles", {"admin": {"scope": "world", "actions": []}}) == {`role admin: scope world is not one of ["global", "job", "target", "tenant"]`}
	problems_with("roles", {"admin": {"scope": "global"}}) == {"role admin: actions is not an array"}
	problems_with("roles", {"admin": {"scope": "global", "actions": ["*", "Inventory.Get", 1, "inventory.*", "a.b"]}}) == {
		"role admin: action * is not service.method or service.*",
		"role admin: action Inventory.Get is not service.method or service.*",
		"role admin: action 1 is not service.method or service.*",
	}
	problems_with("roles", {"admin": {"scope": "global", "actions": [], "tenant": "acme"}}) == {"role admin: unknown key tenant"}
}

test_authenticated_actions_problems if {
	problems_with("authenticated_actions", "health.*") == {"authenticated_actions is not an array"}
	problems_with("authenticated_actions", ["health.*", "*"]) == {"authenticated_actions: * is not service.method or service.*"}
}

test_class_problems if {
	problems_with("classes", []) == {"classes is not an object"}
	problems_with("classes", {"a": 1}) == {"class a: not an object"}
	problems_with("classes", {"a": {"max_ttl": "1 hour", "read_only": "yes", "max_iops": -1, "min_hash": "md5", "min_dh_group": "ffdhe1024", "auth_mode": "chap"}}) == {
		"class a: max_ttl has an invalid value 1 hour",
		"class a: read_only has an invalid value yes",
		"class a: max_iops has an invalid value -1",
		"class a: min_hash has an invalid value md5",
		"class a: min_dh_group has an invalid value ffdhe1024",
		"class a: auth_mode has an invalid value chap",
	}
	problems_with("classes", {"a": {"max_ttl": "0s"}}) == {"class a: max_ttl has an invalid value 0s"}
	problems_with("classes", {"a": {"read_onyl": true}}) == {"class a: unknown key read_onyl"}
	problems_with("classes", {"a": {"auth_options": []}}) == {"class a: auth_options is not a non-empty array"}
	problems_with("classes", {"a": {"auth_options": {"auth_mode": "tls"}}}) == {"class a: auth_options is not a non-empty array"}
	problems_with("classes", {"a": {"auth_options": [{"auth_mode": "tls"}, "dhchap", {"auth_options": []}]}}) == {
		"class a: auth_options[1]: not an object",
		"class a: auth_options[2]: unknown key auth_options",
	}
	problems_with("classes", {"a,b": {}}) == {"class name a,b is not a label"}
}

test_default_obligations_problems if {
	problems_with("default_obligations", {"max_ttl": 3600}) == {"default_obligations: max_ttl has an invalid value 3600"}
	problems_with("default_obligations", {"auth_options": [{}]}) == {"default_obligations: unknown key auth_options"}
	problems_with("default_obligations", "24h") == {"default_obligations: not an object"}
}

test_residency_problems if {
	problems_with("residency", []) == {"residency is not an object"}
	problems_with("residency", {"eu-west": ["eu-west"]}) == {"residency eu-west: not an object"}
	problems_with("residency", {"eu-west": {"target_regions": "eu-west", "fabrics": [], "zones": ["a"]}}) == {
		"residency eu-west: target_regions is not a non-empty array of strings",
		"residency eu-west: fabrics is not a non-empty array of strings",
		"residency eu-west: unknown key zones",
	}
}

test_load_check_with_bad_data if {
	authz.load_check == {"problems": {"class a: max_ttl has an invalid value 1 day"}} with data.nvmegate.classes as {"a": {"max_ttl": "1 day"}}
}

test_derived_is_reserved if {
	problems_with("derived", {}) == {"nvmegate.derived is reserved: the engine computes it"}
}

# Every self-test sample decides as selftest.json says (opa test loads the
# file as data.samples; go test's TestRego does the same).
test_selftest_samples if {
	count(data.samples) > 0
	every s in data.samples {
		d := decide(s.input)
		d.allow == s.allow
		object.get(s, "reasons", d.reasons) == d.reasons
	}
}
