package nvmegate.authz

# --- Checks of data.nvmegate --------------------------------------------------------
#
# The engine evaluates data_problems once per policy revision, before the
# self-test, and refuses a revision whose data has any: requests then never
# meet malformed data (a class whose max_ttl is not a duration, a residency
# entry that is not an object, ...). opa test checks the shipped data too.

scope_names := {"global", "tenant", "job", "target"}

obligation_types := {
	"max_ttl": "max_ttl", "require_tls": "boolean", "bidirectional": "boolean", "read_only": "boolean",
	"auth_mode": "auth_mode", "min_hash": "hash", "min_dh_group": "dh_group",
	"max_iops": "count", "max_mbps": "count", "reauth_within": "max_ttl", "rotate_every": "max_ttl",
	"reencrypt_every": "max_ttl",
}

has_type("max_ttl", v) if {
	valid_duration(v)
	time.parse_duration_ns(v) > 0
}

has_type("auth_mode", v) if v in {"dhchap", "tls", "both"}

has_type("hash", v) if v in object.keys(hash_rank)

has_type("dh_group", v) if v in object.keys(dh_group_rank)

action_or_wildcard := `^[a-z][a-z0-9_]*\.([a-z][a-z0-9_]*|\*)$`

data_problems contains "data.nvmegate.roles is not an object" if not roles_object

roles_object if is_object(data.nvmegate.roles)

data_problems contains sprintf("role %s is not an object", [r]) if {
	some r, def in data.nvmegate.roles
	not is_object(def)
}

data_problems contains sprintf("role %s: scope %v is not one of %v", [r, object.get(def, "scope", null), sort(scope_names)]) if {
	some r, def in data.nvmegate.roles
	is_object(def)
	not object.get(def, "scope", null) in scope_names
}

data_problems contains sprintf("role %s: actions is not an array", [r]) if {
	some r, def in data.nvmegate.roles
	is_object(def)
	not is_array(object.get(def, "actions", null))
}

data_problems contains sprintf("role %s: action %v is not service.method or service.*", [r, a]) if {
	some r, def in data.nvmegate.roles
	is_object(def)
	some a in def.actions
	not action_pattern_ok(a)
}

data_problems contains sprintf("role %s: unknown key %s", [r, k]) if {
	some r, def in data.nvmegate.roles
	is_object(def)
	some k, _ in def
	not k in {"scope", "actions"}
}

data_problems contains "authenticated_actions is not an array" if {
	x := data.nvmegate.authenticated_actions
	not is_array(x)
}

data_problems contains sprintf("authenticated_actions: %v is not service.method or service.*", [a]) if {
	some a in data.nvmegate.authenticated_actions
	not action_pattern_ok(a)
}

action_pattern_ok(a) if {
	is_string(a)
	regex.match(action_or_wildcard, a)
}

data_problems contains "classes is not an object" if not classes_object

classes_object if is_object(data.nvmegate.classes)

data_problems contains sprintf("class %s: %s", [c, p]) if {
	some c, def in data.nvmegate.classes
	some p in class_problems(def)
}

data_problems contains sprintf("default_obligations: %s", [p]) if {
	some p in obligations_problems(default_obligations)
}

class_problems(def) := {"not an object"} if {
	not is_object(def)
} else := obligations_problems(object.remove(def, ["auth_options"])) | {msg |
	has_key(def, "auth_options")
	some msg in auth_options_problems(def.auth_options)
}

auth_options_problems(opts) := {"auth_options is not a non-empty array"} if {
	not is_array(opts)
} else := {"auth_options is not a non-empty array"} if {
	count(opts) == 0
} else := {msg |
	some i, o in opts
	some p in obligations_problems(o)
	msg := sprintf("auth_options[%d]: %s", [i, p])
}

# obligations_problems: what is wrong with an obligations document.
obligations_problems(doc) := {"not an object"} if {
	not is_object(doc)
} else := {msg |
	some k, v in doc
	msg := obligation_problem(k, v)
}

obligation_problem(k, v) := sprintf("%s has an invalid value %v", [k, v]) if {
	t := obligation_types[k]
	not has_type(t, v)
}

obligation_problem(k, _) := sprintf("unknown key %s", [k]) if not obligation_types[k]

data_problems contains "residency is not an object" if {
	x := data.nvmegate.residency
	not is_object(x)
}

data_problems contains sprintf("residency %s: %s", [r, p]) if {
	some r, fence in data.nvmegate.residency
	some p in fence_problems(fence)
}

fence_problems(fence) := {"not an object"} if {
	not is_object(fence)
} else := {msg |
	some k, v in fence
	msg := fence_problem(k, v)
}

fence_problem(k, v) := sprintf("%s is not a non-empty array of strings", [k]) if {
	k in {"target_regions", "fabrics"}
	not non_empty_strings(v)
}

fence_problem(k, _) := sprintf("unknown key %s", [k]) if not k in {"target_regions", "fabrics"}

non_empty_strings(v) if {
	has_type("strings", v)
	count(v) > 0
}

data_problems contains sprintf("class name %v is not a label", [c]) if {
	some c, _ in data.nvmegate.classes
	not regex.match(`^[A-Za-z0-9][A-Za-z0-9._-]*$`, c)
}

data_problems contains "nvmegate.derived is reserved: the engine computes it" if {
	_ = data.nvmegate.derived
}

# load_check is what the engine evaluates once per policy revision: the
# data's problems (any refuses the revision) and, for data without any, the
# derived data it stores at data.nvmegate.derived.
load_check := {"problems": data_problems, "derived": derived_data} if {
	count(data_problems) == 0
} else := {"problems": data_problems}
