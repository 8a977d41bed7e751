package nvmegate.authz

# --- Data classes and obligations ----------------------------------------------
#
# Every namespace has a data class; data.nvmegate.classes[<class>] holds the
# obligations a grant touching it must meet, with the keys of the decision's
# obligations (authz/doc.go) plus auth_options:
#
#   max_ttl        Go duration > 0     read_only      boolean
#   require_tls    boolean             bidirectional  boolean
#   auth_mode      dhchap|tls|both     min_hash       sha256|sha384|sha512
#   min_dh_group   null|ffdhe2048|ffdhe3072|ffdhe4096|ffdhe6144|ffdhe8192
#   max_iops, max_mbps  integer >= 0 (0: no cap)
#   rotate_every   Go duration > 0: how often the keys of a namespace of the
#                  class (its access root and key-encryption key) must
#                  rotate; not a grant's obligation: the compliance
#                  attestation checks the keys' ages against it
#                  (compliance.rego)
#   reencrypt_every Go duration > 0: how old the data key of a namespace
#                  of the class that nvmegate encrypts at rest may grow
#                  before it is rotated by re-encryption; not a grant's
#                  obligation: the compliance attestation checks the data
#                  key's age against it, and the gateway starts the
#                  re-encryption once the subsystem is idle
#   reauth_within  Go duration > 0: when a change makes a live grant's
#                  obligations stronger than those it was issued under, the
#                  time it has to renew before it is revoked (default 5m)
#   auth_options   [obligations, ...]: alternatives; for a connect or renew
#                  the first one the subsystem supports applies (TLS needs a
#                  TLS subsystem, DH-HMAC-CHAP or bidirectional a DH-HMAC-CHAP
#                  one); none supported denies
#
# A class with read_only may not be admitted or connected with mode rw.
# data.nvmegate.default_obligations apply to every namespace action. The
# obligations of all namespaces involved merge to the most restrictive: the
# smallest max_ttl, any true boolean, the strongest hash and DH group, the
# smallest non-zero QoS cap (the namespaces' QoS records included), auth_mode
# "both" when TLS and DH-HMAC-CHAP are both asked for. A grant is read-only
# also when the job scope gives none of its namespaces mode rw.
#
# A requested TTL above max_ttl is not denied: the gateway caps the grant at
# max_ttl (and at the job's expiry).

classes := data.nvmegate.classes

default default_obligations := {}

# Read by path, never as data.nvmegate: the data document may be large.
default_obligations := data.nvmegate.default_obligations

hash_names := ["sha256", "sha384", "sha512"]

hash_rank := {h: i | some i, h in hash_names}

dh_group_names := ["null", "ffdhe2048", "ffdhe3072", "ffdhe4096", "ffdhe6144", "ffdhe8192"]

dh_group_rank := {g: i | some i, g in dh_group_names}

# --- Connect and renew: one subsystem ----------------------------------------
#
# The obligations of a grant depend on the set of data classes on the
# subsystem and on what the subsystem supports (TLS, DH-HMAC-CHAP), and on
# nothing else but the namespaces' QoS caps and modes. The engine computes
# them once per policy revision for every set of classes (data.nvmegate.derived,
# see derived_data) so that a connect looks them up; without that table
# (opa test, opa eval) they are computed per request, by the same rules.

# subsystem_ok: connect and renew concern one subsystem, which holds the
# namespaces, some of them in the job's scope, and supports what their
# classes require.
subsystem_ok if {
	sub := input.resource.subsystem
	nqn := sub.nqn
	is_string(nqn)
	nqn != ""
	{p[1] | some p in placements} == {nqn}
	scope_modes != {""}
	caps_ok(iops_caps)
	caps_ok(mbps_caps)
	class_set_entry.ok == true
}

# caps_key: what the subsystem supports, as the table keys it.
caps_key := {
	[true, true]: "tls+dhchap", [true, false]: "tls",
	[false, true]: "dhchap", [false, false]: "none",
}[[input.resource.subsystem.tls, input.resource.subsystem.dhchap]]

caps_of := {"tls+dhchap": [true, true], "tls": [true, false], "dhchap": [false, true], "none": [false, false]}

# class_set_entry: {"ok": the subsystem can meet the classes' obligations,
# "obligations": their merge with the defaults}.
class_set_entry := e if {
	is_string(min(used_classes))
	is_string(max(used_classes))
	e := data.nvmegate.derived.obligations[concat(",", sort(used_classes))][caps_key]
} else := class_set_obligations(used_classes, caps_of[caps_key])

# class_set_obligations(cls, caps): the entry for classes cls on a subsystem
# supporting caps ([tls, dhchap]): each class's obligations (but its
# auth_options) with the first of its auth options the subsystem supports,
# and the defaults, merged to the most restrictive.
class_set_obligations(cls, caps) := {"ok": ok, "obligations": merged} if {
	chosen := [opts[0] |
		some c in cls
		opts := [o | some o in classes[c].auth_options; supports(o, caps)]
	]
	with_options := [c | some c in cls; classes[c].auth_options]
	docs := array.concat(
		array.concat([object.remove(default_obligations, ["rotate_every", "reencrypt_every"])], [object.remove(classes[c], ["auth_options", "rotate_every", "reencrypt_every"]) | some c in cls]),
		chosen,
	)
	merged := merge_obligations(docs)
	ok := set_supported(count(chosen) == count(with_options), merged, caps)
}

default set_supported(_, _, _) := false

set_supported(true, merged, caps) if supports(merged, caps)

# supports(o, caps): a subsystem supporting caps ([tls, dhchap]) can meet
# the obligations o: its auth_mode, a required TLS channel, bidirectional
# DH-HMAC-CHAP.
supports(o, caps) if {
	m := object.get(o, "auth_mode", "")
	[m in {"tls", "both"}, caps[0]] != [true, false]
	[m in {"dhchap", "both"}, caps[1]] != [true, false]
	[object.get(o, "require_tls", false), caps[0]] != [true, false]
	[object.get(o, "bidirectional", false), caps[1]] != [true, false]
}

# merge_obligations(docs): the most restrictive of the obligations docs.
merge_obligations(docs) := object.union_n([
	{k: true | some d in docs; some k, v in d; v == true},
	{"max_ttl": min(ttls)[1] | count(ttls) > 0},
	{"reauth_within": min(reauths)[1] | count(reauths) > 0},
	{"min_hash": hash_names[max(hashes)] | count(hashes) > 0},
	{"min_dh_group": dh_group_names[max(groups)] | count(groups) > 0},
	{"auth_mode": combined_auth_mode(modes) | count(modes) > 0},
	{"max_iops": min(iops) | count(iops) > 0},
	{"max_mbps": min(mbps) | count(mbps) > 0},
]) if {
	ttls := {[time.parse_duration_ns(d.max_ttl), d.max_ttl] | some d in docs}
	reauths := {[time.parse_duration_ns(d.reauth_within), d.reauth_within] | some d in docs}
	hashes := {hash_rank[d.min_hash] | some d in docs}
	groups := {dh_group_rank[d.min_dh_group] | some d in docs}
	modes := {d.auth_mode | some d in docs}
	iops := {v | some d in docs; v := d.max_iops; v > 0}
	mbps := {v | some d in docs; v := d.max_mbps; v > 0}
}

combined_auth_mode(modes) := "both" if {
	"both" in modes
} else := "both" if {
	"tls" in modes
	"dhchap" in modes
} else := m if {
	some m in modes
}

# merged_obligations: the class set's obligations, read-only unless the
# job scope gives some namespace mode rw, and capped by the namespaces' QoS.
merged_obligations := object.union_n([
	ob,
	{"read_only": true | not "rw" in scope_modes},
	{"max_iops": min(iops) | count(iops) > 0},
	{"max_mbps": min(mbps) | count(mbps) > 0},
	nvmet_tls_auth(ob),
]) if {
	ob := class_set_entry.obligations
	iops := (iops_caps | {object.get(ob, "max_iops", 0)}) - {0}
	mbps := (mbps_caps | {object.get(ob, "max_mbps", 0)}) - {0}
}

# nvmet_tls_auth(ob): on a Linux nvmet target, TLS alone does not
# authenticate the host. nvmet keys the session with whatever PSK the
# target's keyring holds for the identity the host presents, and never
# compares that identity with the host NQN of the Connect command (Linux
# 6.12), so a host holding its own PSK could connect as any other host
# allowed on the port. A TLS grant there carries DH-HMAC-CHAP inside the
# TLS session too: auth_mode "both" (the gateway refuses it on a subsystem
# without DH-HMAC-CHAP).
nvmet_tls_auth(ob) := {"auth_mode": "both"} if {
	target.driver == "nvmet"
	object.get(ob, "auth_mode", "") == "tls"
} else := {}

# derived_data: what the engine stores at data.nvmegate.derived once per
# revision: the class set entries of every set of classes and every
# combination of subsystem capabilities (for up to 8 classes: 1020 entries;
# with more, connects compute their entry per request).
derived_data := {"obligations": {concat(",", set_): {k: class_set_obligations(set_, caps) | some k, caps in caps_of} |
	some set_ in class_subsets
}}

class_names := sort(object.keys(classes))

class_subsets := [[class_names[i] |
	some i in numbers.range(0, count(class_names) - 1)
	bits.and(mask, bits.lsh(1, i)) != 0
] |
	count(class_names) > 0
	count(class_names) <= 8
	some mask in numbers.range(1, bits.lsh(1, count(class_names)) - 1)
]

# --- Problems -------------------------------------------------------------------

namespace_problems contains p if some p in namespace_class_problems(checked_namespaces)

# namespace_class_problems(nss): the class problems of the namespaces nss
# (the subject tenant's): no class, a class the policy does not define, rw
# on a read-only class (the namespace's mode or request.mode).
namespace_class_problems(nss) := {sprintf("namespace %s has no data class", [ns_label(ns)]) |
	some ns in nss
	has_key(ns, "data_class")
	not non_empty(ns.data_class)
} | {sprintf("namespace %s has data class %s, which the policy does not define", [ns_label(ns), ns.data_class]) |
	some ns in nss
	non_empty(ns.data_class)
	not classes[ns.data_class]
} | {sprintf("namespace %s is read-only (data class %s): mode rw is not allowed", [ns_label(ns), ns.data_class]) |
	some ns in nss
	classes[ns.data_class].read_only == true
	"rw" in {ns.mode, object.get(request, "mode", "")}
}

# subsystem_detail_problems(nss): what keeps the subsystem of a connect or
# renew from serving the namespaces nss (the subject tenant's): no
# subsystem, none of them in the job's scope, one on another subsystem, a
# garbled subsystem record, authentication their classes require and the
# subsystem does not support.
subsystem_detail_problems(nss) := subsystem_problems | {sprintf("namespace %s is not on subsystem %s", [ns_label(ns), show_at(subsystem, "nqn")]) |
	some ns in nss
	not ns.subsystem_nqn == subsystem.nqn
} | {sprintf("subsystem %s supports no authentication option of data class %s", [show_at(subsystem, "nqn"), c]) |
	caps := caps_of[caps_key]
	some c in {ns.data_class | some ns in nss}
	classes[c].auth_options
	count([o | some o in classes[c].auth_options; supports(o, caps)]) == 0
}

subsystem_problems contains "request names no subsystem" if not non_empty(object.get(subsystem, "nqn", null))

subsystem_problems contains sprintf("subsystem %s holds no namespace of job %s", [show_at(subsystem, "nqn"), show_at(job, "job_id")]) if {
	not job_namespace_on_subsystem
}

job_namespace_on_subsystem if {
	some ns in namespaces
	ns.mode in {"ro", "rw"}
}

subsystem_problems contains p if some p in record_shape_problems("subsystem", "subsystem")

subsystem_problems contains sprintf("subsystem %s does not support the authentication its data classes require (%s)", [show_at(subsystem, "nqn"), concat(", ", needs)]) if {
	caps := caps_of[caps_key]
	ob := class_set_entry.obligations
	not supports(ob, caps)
	needs := [sprintf("%s %v", [k, ob[k]]) | some k in ["auth_mode", "require_tls", "bidirectional"]; ob[k]]
}
