package nvmegate.authz

# --- Compliance -------------------------------------------------------------------
#
# compliance is what the gateway's compliance attestation states of each
# namespace of the inventory: whether its placement keeps to the geo-fence
# of its region (residency_problems, with no job: the fence alone), and the
# rotation period its data class declares for its keys (rotate_every, a Go
# duration; "" if the class and the defaults declare none). The gateway
# evaluates data.nvmegate.authz.compliance with
#
#   input.namespaces: [namespace, ...]   (as input.resource.namespaces,
#                                         each with its target)
#
# and gets {"namespaces": [{"residency_problems": [...], "rotate_every": d,
# "reencrypt_every": d}]} in the same order: reencrypt_every is the age its
# class lets a data key reach before a re-encryption rotates it ("" none).
compliance := {"namespaces": [{
	"residency_problems": sort(residency_problems([ns])),
	"rotate_every": period_of(ns, "rotate_every"),
	"reencrypt_every": period_of(ns, "reencrypt_every"),
} |
	some ns in input.namespaces
]}

# period_of(ns, key): a duration of ns's data class, or of the defaults.
period_of(ns, key) := classes[ns.data_class][key] if {
	is_string(classes[ns.data_class][key])
} else := default_obligations[key] if {
	is_string(default_obligations[key])
} else := ""
