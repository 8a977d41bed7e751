package nvmegate.authz_test

# Data classes, the obligations of grants, and the subsystem of a connect.

import data.nvmegate.authz

tls_only := {"dhchap": false, "tls": true}

dhchap_only := {"dhchap": true, "tls": false}

obligations_of(x) := d.obligations if {
	d := decide(x)
	d.allow
}

# --- Obligations by class ---------------------------------------------------------------

test_internal_obligations if {
	obligations_of(connect({})) == {"max_ttl": "24h", "read_only": true}
	obligations_of(connect({"namespaces": [ns(1, {"mode": "rw"})]})) == {"max_ttl": "24h"}
}

test_public_obligations_are_the_defaults if {
	obligations_of(connect({"namespaces": [ns(1, {"data_class": "public", "mode": "rw"})]})) == {"max_ttl": "24h"}
}

spdk_target := object.union(target_rec, {"driver": "spdk"})

test_restricted_prefers_tls if {
	x := {"namespaces": [ns(1, {"data_class": "restricted"})], "target": spdk_target}
	want := {"auth_mode": "tls", "require_tls": true, "max_ttl": "1h", "read_only": true}
	obligations_of(connect(x)) == want
	obligations_of(connect(object.union(x, {"subsystem": tls_only}))) == want
}

# nvmet does not bind a TLS PSK to the host NQN of the Connect command: a
# TLS grant there carries DH-HMAC-CHAP inside the session (auth_mode both).
test_restricted_tls_on_nvmet_carries_dhchap if {
	x := {"namespaces": [ns(1, {"data_class": "restricted"})]}
	target_rec.driver == "nvmet" # the fixtures' target
	obligations_of(connect(x)) == {"auth_mode": "both", "require_tls": true, "max_ttl": "1h", "read_only": true}
	obligations_of(connect(object.union(x, {"subsystem": dhchap_only}))).auth_mode == "dhchap"
}

test_restricted_falls_back_to_bidirectional_dhchap if {
	x := {"namespaces": [ns(1, {"data_class": "restricted"})], "subsystem": dhchap_only}
	obligations_of(connect(x)) == {
		"auth_mode": "dhchap", "bidirectional": true, "min_dh_group": "ffdhe3072", "min_hash": "sha384",
		"max_ttl": "1h", "read_only": true,
	}
}

test_restricted_needs_a_capable_subsystem if {
	x := {"namespaces": [ns(1, {"data_class": "restricted"})], "subsystem": {"dhchap": false, "tls": false}}
	decide(connect(x)).reasons == ["subsystem nqn.2026-01.org.example:acme-train supports no authentication option of data class restricted"]
}

test_immutable_is_read_only if {
	obligations_of(connect({"namespaces": [ns(1, {"data_class": "immutable"})]})) == {"max_ttl": "24h", "read_only": true}
	r := "namespace nqn.2026-01.org.example:acme-train/1 is read-only (data class immutable): mode rw is not allowed"
	decide(connect({"namespaces": [ns(1, {"data_class": "immutable", "mode": "rw"})]})).reasons == [r]
	decide(connect({"namespaces": [ns(1, {"data_class": "immutable"})], "request": {"mode": "rw"}})).reasons == [r]
	decide(admit({"namespaces": [ns(1, {"data_class": "immutable", "mode": "rw"})]})).reasons == [r]
	allowed(decide(admit({"namespaces": [ns(1, {"data_class": "immutable", "mode": "ro"})]})))
}

test_obligations_merge_to_the_most_restrictive if {
	nss := [
		ns(1, {"data_class": "internal"}),
		ns(2, {"data_class": "restricted"}),
		ns(3, {"data_class": "immutable"}),
		ns(4, {"data_class": "public", "mode": "rw", "qos": {"max_iops": 5000, "max_mbps": 0}}),
		ns(5, {"data_class": "public", "mode": "rw", "qos": {"max_iops": 2000, "max_mbps": 800}}),
	]
	obligations_of(connect({"namespaces": nss, "target": spdk_target})) == {
		"auth_mode": "tls", "require_tls": true, "max_ttl": "1h", "read_only": true,
		"max_iops": 2000, "max_mbps": 800,
	}
}

test_merge_rules if {
	classes := {
		"a": {"max_ttl": "90m", "min_hash": "sha256", "min_dh_group": "ffdhe2048", "auth_mode": "tls", "max_iops": 300},
		"b": {"max_ttl": "1h30m", "min_hash": "sha512", "min_dh_group": "ffdhe4096", "auth_mode": "dhchap", "bidirectional": true, "max_iops": 0},
	}
	x := connect({"namespaces": [ns(1, {"data_class": "a", "mode": "rw"}), ns(2, {"data_class": "b", "qos": {"max_iops": 500, "max_mbps": 0}})]})
	obligations_of(x) == {
		"max_ttl": "1h30m", "min_hash": "sha512", "min_dh_group": "ffdhe4096", "auth_mode": "both",
		"bidirectional": true, "max_iops": 300,
	} with data.nvmegate.classes as classes
	obligations_of(connect({"namespaces": [ns(1, {"data_class": "a"})], "target": spdk_target})) == {
		"max_ttl": "90m", "min_hash": "sha256", "min_dh_group": "ffdhe2048", "auth_mode": "tls",
		"max_iops": 300, "read_only": true,
	} with data.nvmegate.classes as classes
	authz.combined_auth_mode({"both", "tls"}) == "both"
	authz.combined_auth_mode({"dhchap"}) == "dhchap"
}

test_default_obligations_are_data if {
	obligations_of(connect({"namespaces": [ns(1, {"data_class": "public", "mode": "rw"})]})) == {"max_ttl": "2h", "require_tls": true} with data.nvmegate.default_obligations as {"max_ttl": "2h", "require_tls": true}
	obligations_of(connect({"namespaces": [ns(1, {"data_class": "public", "mode": "rw"})]})) == {} with data.nvmegate.default_obligations as {}
}

test_fixed_requirements_the_subsystem_cannot_meet if {
	classes := object.union(data.nvmegate.classes, {"internal": {"require_tls": true, "auth_mode": "tls"}})
	d := decide(connect({"subsystem": dhchap_only})) with data.nvmegate.classes as classes
	d.reasons == ["subsystem nqn.2026-01.org.example:acme-train does not support the authentication its data classes require (auth_mode tls, require_tls true)"]
	d2 := decide(connect({"subsystem": tls_only})) with data.nvmegate.classes as object.union(data.nvmegate.classes, {"internal": {"bidirectional": true}})
	d2.reasons == ["subsystem nqn.2026-01.org.example:acme-train does not support the authentication its data classes require (bidirectional true)"]
}

test_unknown_or_missing_class_denied if {
	decide(connect({"namespaces": [ns(1, {"data_class": "secret"})]})).reasons == ["namespace nqn.2026-01.org.example:acme-train/1 has data class secret, which the policy does not define"]
	d := decide(connect({"namespaces": [object.remove(ns(1, {}), ["data_class"])]}))
	denied_with(d, "namespace nqn.2026-01.org.example:acme-train/1 has no data_class")
	denied_with(decide(connect({"namespaces": [ns(1, {"data_class": ""})]})), "namespace nqn.2026-01.org.example:acme-train/1 has no data class")
}

test_only_grants_get_obligations if {
	decide(node_call("access.discover", {})).obligations == {}
	decide(node_call("access.release", {})).obligations == {}
	decide(admit({})).obligations == {}
	obligations_of(node_call("access.renew", {})) == {"max_ttl": "24h", "read_only": true}
}

# --- The subsystem of a connect ---------------------------------------------------------

test_connect_needs_its_subsystem if {
	d := decide(json.remove(connect({}), ["resource/subsystem"]))
	denied_with(d, "request names no subsystem")
	denied_with(decide(connect({"subsystem": {"nqn": ""}})), "request names no subsystem")
}

test_connect_namespaces_are_on_the_subsystem if {
	other := "nqn.2026-01.org.example:acme-eval"
	d := decide(connect({"namespaces": [ns(1, {}), ns(2, {"subsystem_nqn": other})]}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-eval/2 is not on subsystem nqn.2026-01.org.example:acme-train"]
}

test_connect_needs_a_namespace_of_the_job if {
	d := decide(connect({"namespaces": [ns(1, {"mode": ""}), ns(2, {"mode": ""})]}))
	d.reasons == ["subsystem nqn.2026-01.org.example:acme-train holds no namespace of job j1"]
	decide(connect({"namespaces": []})).reasons == ["subsystem nqn.2026-01.org.example:acme-train holds no namespace of job j1"]

	# A namespace the job does not name still counts for residency and
	# obligations: the host sees every namespace of the subsystem.
	obligations_of(connect({"namespaces": [ns(1, {}), ns(2, {"mode": "", "data_class": "restricted"})]})).max_ttl == "1h"
}

test_connect_garbled_subsystem_or_qos_denied if {
	denied_with(decide(connect({"subsystem": {"tls": "yes"}})), "resource.subsystem.tls is not a boolean")
	every q in [-1, "100", 1.5, null] {
		denied_with(
			decide(connect({"namespaces": [ns(1, {"qos": {"max_iops": q, "max_mbps": 0}})]})),
			"resource.namespaces[0].qos.max_iops is not a non-negative integer",
		)
	}
	denied_with(decide(connect({"namespaces": [json.remove(ns(1, {}), ["qos/max_mbps"])]})), "namespace nqn.2026-01.org.example:acme-train/1 has no qos.max_mbps")
	authz.caps_ok(set())
	not authz.caps_ok({1, "x"})
}

# --- The per-revision table -------------------------------------------------------------

test_derived_table_matches_per_request_computation if {
	derived := authz.derived_data
	count(derived.obligations) == 15
	every key, entries in derived.obligations {
		every caps_name, entry in entries {
			entry == authz.class_set_obligations(split(key, ","), authz.caps_of[caps_name])
		}
	}
	every x in [
		connect({}),
		connect({"namespaces": [ns(1, {"data_class": "restricted"}), ns(2, {"data_class": "immutable"})], "subsystem": dhchap_only}),
		connect({"namespaces": [ns(1, {"data_class": "restricted"})], "subsystem": {"dhchap": false, "tls": false}}),
	] {
		decide(x) == decide(x) with data.nvmegate.derived as derived
	}
}

test_derived_table_limits if {
	authz.class_subsets == [] with data.nvmegate.classes as {}
	nine := {sprintf("c%d", [i]): {} | some i in numbers.range(1, 9)}
	authz.class_subsets == [] with data.nvmegate.classes as nine
	authz.derived_data == {"obligations": {}} with data.nvmegate.classes as nine
}

test_caps_keys if {
	every name, caps in authz.caps_of {
		authz.caps_key == name with input as connect({"subsystem": {"tls": caps[0], "dhchap": caps[1]}})
	}
}
