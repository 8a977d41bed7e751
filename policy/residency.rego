package nvmegate.authz

# --- Namespace actions: residency and classes ------------------------------------
#
# jobs.admit, access.discover, access.connect and access.renew are judged on
# the namespaces they involve. Residency: a job may touch a namespace only if
# the namespace's region is one of the job's allowed regions, and the
# namespace's data may only be served from a target the geo-fence of its
# region allows:
#
#   data.nvmegate.residency[<namespace region>] = {
#     "target_regions": [...],  # regions of targets that may serve it
#     "fabrics": [...]          # optional: the fabrics that may carry it
#   }
#
# A region without an entry (or an entry without target_regions) allows only
# targets in the same region, on any fabric. Classes: classes.rego.

# ns_facts: per namespace with an nsid in 1-4294967294 (as Rego orders
# values by type first, the two comparisons also exclude non-numbers),
# what the checks read of it:
# [tenant, subsystem_nqn, region, target region, target fabric, data_class,
# mode, qos.max_iops, qos.max_mbps]. A namespace lacking one has no facts,
# and namespaces_ok fails on the count.
ns_facts := [[
	ns.tenant, ns.subsystem_nqn, ns.region, ns.target.region, ns.target.fabric, ns.data_class,
	ns.mode, ns.qos.max_iops, ns.qos.max_mbps,
] |
	some ns in input.resource.namespaces
	ns.nsid >= 1
	ns.nsid <= 4294967294
]

# The distinct facts, each judged once however many namespaces share it:
# placements (tenant, subsystem, region, target region and fabric: one in
# practice) and class_modes (data class, mode: a few).
placements := {array.slice(f, 0, 5) | some f in ns_facts}

class_modes := {array.slice(f, 5, 7) | some f in ns_facts}

used_classes := {cm[0] | some cm in class_modes}

scope_modes := {cm[1] | some cm in class_modes}

# QoS caps of the namespaces (for the obligations of connect and renew).
iops_caps := {f[7] | some f in ns_facts}

mbps_caps := {f[8] | some f in ns_facts}

default residency := {}

residency := data.nvmegate.residency

# namespaces_ok(t): every namespace is tenant t's, in a region the job
# allows, on a target its geo-fence allows, of a known class that allows
# its mode.
namespaces_ok(t) if {
	res := input.resource
	nss := object.get(res, "namespaces", [])
	is_array(nss)
	count(ns_facts) == count(nss)
	regions := res.job.allowed_regions
	is_array(regions)
	is_string(min(regions))
	is_string(max(regions))
	count({p |
		some p in placements
		p[0] == t
		p[2] in regions
		fence := object.get(residency, p[2], {})
		p[3] in object.get(fence, "target_regions", [p[2]])
		p[4] in object.get(fence, "fabrics", [p[4]])
	}) == count(placements)
	count(scope_modes - {"", "ro", "rw"}) == 0
	req_mode := object.get(res, ["request", "mode"], "")
	count({cm |
		some cm in class_modes
		read_only := object.get(classes[cm[0]], "read_only", false)
		[cm[1], read_only] != ["rw", true]
		[req_mode, read_only] != ["rw", true]
	}) == count(class_modes)
}

# caps_ok: every cap is an integer >= 0. As Rego orders values by type
# first, a set whose least and greatest elements are numbers holds nothing
# else.
caps_ok(caps) if {
	count(caps) == 0
} else if {
	least := min(caps)
	is_number(least)
	least >= 0
	is_number(max(caps))
	count({c | some c in caps; floor(c) != c}) == 0
}

# --- Problems ---------------------------------------------------------------------

# details_visible: the call may be told about the details (region, target,
# class) of its namespaces: they are its tenant's (schedulers), of a job
# that names it (nodes), or the caller is global.
details_visible if {
	role_scope == "tenant"
	t := input.caller.tenant
	non_empty(t)
	object.get(job, "tenant", t) == t
}

details_visible if {
	role_scope == "job"
	node_in_job
}

details_visible if role_scope == "global"

# checked_namespaces: the namespaces of the subject tenant. The others are
# denied by the tenant checks, without details.
checked_namespaces := [ns |
	some ns in namespaces
	ns.tenant == subject_tenant
] if {
	details_visible
} else := []

namespace_problems contains p if {
	details_visible
	some p in list_shape_problems("namespaces", "namespace")
}

namespace_problems contains p if {
	details_visible
	some p in record_shape_problems("job", "job")
}

# required_namespace_fields: what namespace actions read of every namespace.
required_namespace_fields := [
	["subsystem_nqn"], ["nsid"], ["tenant"], ["region"], ["data_class"], ["mode"],
	["target", "region"], ["target", "fabric"], ["qos", "max_iops"], ["qos", "max_mbps"],
]

namespace_problems contains p if some p in residency_problems(checked_namespaces)

namespace_problems contains p if {
	details_visible
	some p in job_region_problems
}

missing := {"missing": true}

# job_region_problems: the job's allowed regions are unusable.
job_region_problems contains sprintf("job %s names no allowed regions", [show_at(job, "job_id")]) if not job_has_regions

job_has_regions if {
	count(job.allowed_regions) > 0
	has_type("strings", job.allowed_regions)
}

# residency_problems(nss): for each namespace of nss (the subject tenant's,
# whose details the caller may know), the fields namespace actions need
# that it lacks, and where it breaks the job's regions or its geo-fence.
# (A function of the records only: the scope decision uses it too.)
residency_problems(nss) := {sprintf("namespace %s has no %s", [ns_label(ns), concat(".", path)]) |
	some ns in nss
	some path in required_namespace_fields
	object.get(ns, path, missing) == missing
} | {sprintf("namespace %s is in region %s, which job %s does not allow", [ns_label(ns), ns.region, show_at(job, "job_id")]) |
	some ns in nss
	non_empty(ns.region)
	job_has_regions
	not ns.region in job.allowed_regions
} | {sprintf("namespace %s (region %s) may not be served from target %s in region %s", [
	ns_label(ns), ns.region, show_at(ns.target, "id"), ns.target.region,
]) |
	some ns in nss
	non_empty(ns.region)
	non_empty(ns.target.region)
	not target_region_allowed(ns)
} | {sprintf("namespace %s (region %s) may not be served over fabric %s", [ns_label(ns), ns.region, ns.target.fabric]) |
	some ns in nss
	non_empty(ns.region)
	non_empty(ns.target.fabric)
	not ns.target.fabric in object.get(geo_fence(ns.region), "fabrics", [ns.target.fabric])
}

target_region_allowed(ns) if ns.target.region in object.get(geo_fence(ns.region), "target_regions", [ns.region])

geo_fence(region) := f if {
	f := data.nvmegate.residency[region]
	is_object(f)
} else := {}
