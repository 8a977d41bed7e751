package nvmegate.authz_test

# Fabric segmentation: a segmented node connects or renews only through a
# port serving a subnet inside its segment.

segmented(subnets, ports) := connect({
	"host_binding": object.union(binding, {"subnets": subnets}),
	"ports": ports,
})

test_unsegmented_node_connects_through_any_port if {
	allowed(decide(segmented([], [{"id": 1, "subnet": ""}])))
	allowed(decide(connect({})))
}

test_segmented_node_connects_through_a_port_in_its_segment if {
	allowed(decide(segmented(["10.1.0.0/16"], [{"id": 1, "subnet": "10.9.0.0/24"}, {"id": 2, "subnet": "10.1.2.0/24"}])))
	allowed(decide(segmented(["10.1.2.0/24"], [{"id": 2, "subnet": "10.1.2.0/24"}])))
}

test_segmented_node_refused_outside_its_segment if {
	d := decide(segmented(["10.1.0.0/16"], [{"id": 1, "subnet": "10.9.0.0/24"}, {"id": 2, "subnet": ""}]))
	d.allow == false
	"no port of the subsystem serves node spiffe://example.org/node/gpu-01's fabric segment" in d.reasons
}

test_a_wider_port_subnet_is_not_inside_a_narrower_segment if {
	d := decide(segmented(["10.1.2.0/24"], [{"id": 1, "subnet": "10.1.0.0/16"}]))
	d.allow == false
}

test_segmented_node_refused_without_ports if {
	d := decide(segmented(["10.1.0.0/16"], []))
	d.allow == false
	d2 := decide(connect({"host_binding": object.union(binding, {"subnets": ["10.1.0.0/16"]})}))
	d2.allow == false
}

test_segmentation_binds_renew_too if {
	x := object.union(segmented(["10.1.0.0/16"], [{"id": 1, "subnet": "10.9.0.0/24"}]), {"action": "access.renew"})
	decide(x).allow == false
}

test_segmentation_leaves_release_and_discover if {
	x := segmented(["10.1.0.0/16"], [{"id": 1, "subnet": "10.9.0.0/24"}])
	allowed(decide(object.union(x, {"action": "access.release"})))
	allowed(decide(object.union(x, {"action": "access.discover"})))
}

test_malformed_subnets_are_refused if {
	d := decide(connect({"host_binding": object.union(binding, {"subnets": "10.1.0.0/16"})}))
	d.allow == false
	"resource.host_binding.subnets is not an array of strings" in d.reasons
}
