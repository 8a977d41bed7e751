package nvmegate.authz_test

# Garbled input: whatever the gateway (or a hand-written explain input)
# sends, the decision is defined, denies, and says why. Also the value
# checks that keep builtins from failing the evaluation.

import data.nvmegate.authz

test_garbled_namespace_fields_denied if {
	cases := [
		[{"nsid": "1"}, "resource.namespaces[0].nsid is not a namespace ID (an integer 1-4294967294)"],
		[{"nsid": 0}, "resource.namespaces[0].nsid is not a namespace ID (an integer 1-4294967294)"],
		[{"tenant": 7}, "resource.namespaces[0].tenant is not a string"],
		[{"region": ["eu-west"]}, "resource.namespaces[0].region is not a string"],
		[{"mode": "write"}, `resource.namespaces[0].mode is not "", "ro" or "rw"`],
		[{"target": "t1"}, "resource.namespaces[0].target is not an object"],
		[{"target": {"region": 1}}, "resource.namespaces[0].target.region is not a string"],
		[{"qos": "fast"}, "resource.namespaces[0].qos is not an object"],
		[{"data_class": true}, "resource.namespaces[0].data_class is not a string"],
	]
	every c in cases {
		denied_with(decide(connect({"namespaces": [ns(1, c[0])]})), c[1])
		denied_with(decide(admit({"namespaces": [ns(1, object.union({"mode": "rw"}, c[0]))]})), c[1])
	}
}

test_garbled_arrays_denied if {
	denied_with(decide(connect({"namespaces": {"0": ns(1, {})}})), "resource.namespaces is not an array")
	denied_with(decide(connect({"namespaces": ["nqn/1"]})), "resource.namespaces[0] is not an object")
	denied_with(decide(connect({"namespaces": null})), "resource.namespaces is not an array")
	denied_with(decide(connect({"job": {"allowed_regions": "eu-west"}})), "resource.job.allowed_regions is not an array of strings")
	denied_with(decide(connect({"job": {"allowed_regions": ["eu-west", 1]}})), "resource.job.allowed_regions is not an array of strings")
}

# Every action is denied for a garbled record it reads.
test_garbled_records_never_allow_or_fail if {
	job_garbles := [
		{"job": null}, {"job": []}, {"job": {"nodes": null}}, {"job": {"tenant": 1}},
		{"job": {"expires_at": 1.5}}, {"job": {"allowed_regions": [1]}}, {"tenant": 1},
		{"namespaces": 5}, {"namespaces": [null]}, {"namespaces": [ns(1, {"nsid": -1})]},
	]
	node_garbles := array.concat(job_garbles, [
		{"job": {"state": null}}, {"host_binding": []}, {"host_binding": {"spiffe_id": 1}},
		{"host_binding": {"host_nqn": 5}}, {"host_binding": {"tenant": ["acme"]}}, {"host_binding": {"bound": 0}},
		{"request": []}, {"request": {"host_nqn": 1}}, {"request": {"mode": 1}},
	])
	connect_garbles := array.concat(node_garbles, [
		{"subsystem": "x"}, {"subsystem": {"nqn": 1}}, {"subsystem": {"dhchap": null}},
		{"namespaces": [ns(1, {"qos": {"max_iops": "x"}})]}, {"namespaces": [ns(1, {"qos": {"max_mbps": 0.5}})]},
	])
	every g in connect_garbles {
		denied(decide(connect(g)))
		denied(decide(node_call("access.renew", g)))
	}
	every g in node_garbles {
		denied(decide(node_call("access.discover", g)))
	}
	every g in job_garbles {
		denied(decide(admit(g)))
	}
	every g in [{"job": null}, {"job": {"state": null}}, {"host_binding": []}, {"request": {"host_nqn": 1}}, {"tenant": 1}] {
		denied(decide(node_call("access.release", g)))
	}
}

test_garbled_time_never_fails if {
	every t in ["", "yesterday", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", 1, null, [], "9999-01-01T00:00:00Z"] {
		denied_with(decide(object.union(connect({}), {"time": t})), "request time is not an RFC 3339 time")
		denied_with(decide(object.union(admit({}), {"time": t})), "request time is not an RFC 3339 time")
	}
}

test_shape_problem_helpers if {
	authz.field_problems("r", "qos", {"max_iops": -1, "max_mbps": 2, "other": "x"}) == {"r.max_iops is not a non-negative integer"}
	authz.element_problems("p", "binding", 1) == {"p is not an object"}
	authz.element_problems("p", "namespace", {"qos": {"max_mbps": "1"}}) == {"p.qos.max_mbps is not a non-negative integer"}
	authz.record_shape_problems("job", "job") == set() with input as {"resource": {}}
	authz.list_shape_problems("nodes", "binding") == set() with input as {"resource": {"nodes": []}}
	authz.has_type("strings", ["a"])
	not authz.has_type("strings", ["a", 1])
	not authz.has_type("nsid", 4294967295)
	not authz.has_type("count", 1.5)
}

test_valid_time if {
	every s in [
		"2026-10-01T12:00:00Z", "2026-10-01T12:00:00.123456789Z", "2026-10-01T12:00:00+02:00",
		"2028-02-29T00:00:00Z", "2000-02-29T00:00:00Z", "1970-01-01T00:00:00Z", "2261-12-31T23:59:59Z",
	] {
		authz.valid_time(s)
	}
	every s in [
		"2026-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z",
		"2026-13-01T00:00:00Z", "2026-10-01t12:00:00z", "2026-10-01T24:00:00Z", "2026-10-01T12:00:60Z",
		"2026-10-01 12:00:00Z", "2262-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2026-10-01T12:00:00",
		"2026-10-01T12:00:00.1234567890Z", 1, null,
	] {
		not authz.valid_time(s)
	}
}

test_valid_duration if {
	every s in ["1h", "1h30m", "1.5h", "90m", "100ms", "250us", "250µs", "10ns", "99999h"] {
		authz.valid_duration(s)
	}
	every s in ["", "1d", "-1h", "1 h", "h", "999999h", "1h1h1h1h1h", "1.h", 3600, null] {
		not authz.valid_duration(s)
	}
}
