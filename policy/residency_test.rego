package nvmegate.authz_test

# Residency: the job's allowed regions, and the geo-fence of each
# namespace's region (data.nvmegate.residency).

test_namespace_region_must_be_allowed_by_the_job if {
	d := decide(connect({"namespaces": [ns(1, {"region": "us-east", "target": {"region": "us-east"}})]}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/1 is in region us-east, which job j1 does not allow"]
	allowed(decide(connect({
		"namespaces": [ns(1, {"region": "us-east", "target": {"region": "us-east"}})],
		"job": {"allowed_regions": ["eu-west", "us-east"]},
	})))
}

test_target_region_must_be_in_the_geo_fence if {
	d := decide(connect({"namespaces": [ns(1, {"target": {"region": "us-east"}})]}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-east"]

	# eu-west data may be served from eu-central (policy/data.json).
	allowed(decide(connect({"namespaces": [ns(1, {"target": {"region": "eu-central"}})]})))
}

test_region_without_geo_fence_stays_home if {
	home := {"region": "ap-south", "target": {"region": "ap-south"}}
	allowed(decide(connect({"namespaces": [ns(1, home)], "job": {"allowed_regions": ["ap-south"]}})))
	away := {"region": "ap-south", "target": {"region": "eu-west"}}
	d := decide(connect({"namespaces": [ns(1, away)], "job": {"allowed_regions": ["ap-south"]}}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/1 (region ap-south) may not be served from target t1 in region eu-west"]
}

test_geo_fence_fabrics if {
	sovereign := {"region": "eu-sovereign", "target": {"region": "eu-central", "fabric": "sovereign-1"}}
	x := {"namespaces": [ns(1, sovereign)], "job": {"allowed_regions": ["eu-sovereign"]}}
	allowed(decide(connect(x)))
	d := decide(connect(object.union(x, {"namespaces": [ns(1, object.union(sovereign, {"target": {"fabric": "f1"}}))]})))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/1 (region eu-sovereign) may not be served over fabric f1"]
	d2 := decide(connect(object.union(x, {"namespaces": [ns(1, object.union(sovereign, {"target": {"region": "eu-west"}}))]})))
	d2.reasons == ["namespace nqn.2026-01.org.example:acme-train/1 (region eu-sovereign) may not be served from target t1 in region eu-west"]
}

test_residency_is_data if {
	fence := {"eu-west": {"target_regions": ["eu-west", "us-east"]}}
	x := connect({"namespaces": [ns(1, {"target": {"region": "us-east"}})]})
	allowed(decide(x)) with data.nvmegate.residency as fence
	denied(decide(connect({"namespaces": [ns(1, {"target": {"region": "eu-central"}})]}))) with data.nvmegate.residency as fence

	# No residency data: every region stays home.
	allowed(decide(connect({}))) with data.nvmegate.residency as {}
	denied(decide(connect({"namespaces": [ns(1, {"target": {"region": "eu-central"}})]}))) with data.nvmegate.residency as {}
}

test_every_namespace_is_judged if {
	nss := [ns(1, {}), ns(2, {"target": {"region": "eu-central"}}), ns(3, {"region": "us-east", "target": {"region": "us-east"}})]
	d := decide(connect({"namespaces": nss}))
	d.reasons == ["namespace nqn.2026-01.org.example:acme-train/3 is in region us-east, which job j1 does not allow"]
}

test_job_without_allowed_regions_denied if {
	decide(connect({"job": {"allowed_regions": []}})).reasons == ["job j1 names no allowed regions"]
	denied_with(decide(json.remove(connect({}), ["resource/job/allowed_regions"])), "job j1 names no allowed regions")
}

test_namespace_without_placement_denied if {
	denied_with(decide(connect({"namespaces": [object.remove(ns(1, {}), ["region"])]})), "namespace nqn.2026-01.org.example:acme-train/1 has no region")
	d := decide(connect({"namespaces": [object.remove(ns(1, {}), ["target"])]}))
	denied_with(d, "namespace nqn.2026-01.org.example:acme-train/1 has no target.region")
	denied_with(d, "namespace nqn.2026-01.org.example:acme-train/1 has no target.fabric")
}

test_residency_applies_to_discover_and_admit if {
	far := [ns(1, {"target": {"region": "us-west"}})]
	r := "namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-west"
	decide(node_call("access.discover", {"namespaces": far})).reasons == [r]
	decide(admit({"namespaces": [ns(1, {"mode": "ro", "target": {"region": "us-west"}})]})).reasons == [r]
}

test_release_is_not_judged_on_residency if {
	allowed(decide(node_call("access.release", {"namespaces": [ns(1, {"target": {"region": "us-west"}})]})))
}
