package nvmegate.authz

# --- Reading input.resource -----------------------------------------------------
#
# input.resource holds the stored records a request involves (policy/README.md).
# A key may be absent: the request does not involve that record, or the record
# does not exist and is described by its key alone. The accessors below are
# total: a missing or mistyped record reads as {} or [], so a check over it
# fails instead of failing the evaluation. The policy reads and checks the
# fields each action needs; a field it needs that is missing or of the wrong
# type denies, naming the field (the *_shape_problems rules).

resource := input.resource if {
	is_object(input.resource)
} else := {}

job := resource.job if {
	is_object(resource.job)
} else := {}

subsystem := resource.subsystem if {
	is_object(resource.subsystem)
} else := {}

host_binding := resource.host_binding if {
	is_object(resource.host_binding)
} else := {}

request := resource.request if {
	is_object(resource.request)
} else := {}

target := resource.target if {
	is_object(resource.target)
} else := {}

# ns_list and node_list are the arrays as sent (their elements unchecked);
# namespaces and nodes their object elements.
ns_list := object.get(resource, "namespaces", [])

node_list := object.get(resource, "nodes", [])

namespaces := [ns | some ns in ns_list; is_object(ns)] if {
	is_array(ns_list)
} else := []

nodes := [n | some n in node_list; is_object(n)] if {
	is_array(node_list)
} else := []

# --- Field types (reasons) ------------------------------------------------------

# field_types: for each record, the type of each field the policy reads
# (request.ttl is not: the gateway caps a grant's lifetime at max_ttl).
# Types: string, boolean, object, nsid (an integer 1-4294967294), count (an
# integer >= 0), mode ("", "ro" or "rw"), strings (an array of strings),
# time (RFC 3339).
field_types := {
	"target": {"id": "string", "region": "string", "fabric": "string"},
	"subsystem": {"nqn": "string", "tenant": "string", "dhchap": "boolean", "tls": "boolean"},
	"namespace": {
		"subsystem_nqn": "string", "nsid": "nsid", "tenant": "string", "region": "string",
		"data_class": "string", "qos": "object", "mode": "mode", "target": "object",
	},
	"qos": {"max_iops": "count", "max_mbps": "count"},
	"job": {
		"job_id": "string", "tenant": "string", "nodes": "strings",
		"allowed_regions": "strings", "expires_at": "time", "state": "string",
	},
	"binding": {"spiffe_id": "string", "host_nqn": "string", "tenant": "string", "bound": "boolean", "subnets": "strings"},
	"request": {"host_nqn": "string", "mode": "mode"},
}

type_names := {
	"string": "a string", "boolean": "a boolean", "object": "an object",
	"nsid": "a namespace ID (an integer 1-4294967294)", "count": "a non-negative integer",
	"mode": `"", "ro" or "rw"`, "strings": "an array of strings", "time": "an RFC 3339 time",
}

has_type("string", v) if is_string(v)

has_type("boolean", v) if is_boolean(v)

has_type("object", v) if is_object(v)

has_type("nsid", v) if {
	is_number(v)
	v >= 1
	v <= 4294967294
	floor(v) == v
}

has_type("count", v) if {
	is_number(v)
	v >= 0
	floor(v) == v
}

has_type("mode", v) if v in {"", "ro", "rw"}

has_type("strings", v) if {
	is_array(v)
	every x in v {
		is_string(x)
	}
}

has_type("time", v) if valid_time(v)

# field_problems: a reason for every field of obj, a record of type rec at
# path, that is present and of the wrong type. Other fields are ignored.
field_problems(path, rec, obj) := {msg |
	some k, v in obj
	t := field_types[rec][k]
	not has_type(t, v)
	msg := sprintf("%s.%s is not %s", [path, k, type_names[t]])
}

# record_shape_problems: field_problems of resource[key] (record rec), or
# that it is not an object.
record_shape_problems(key, rec) := {sprintf("resource.%s is not an object", [key])} if {
	has_key(resource, key)
	not is_object(resource[key])
} else := field_problems(sprintf("resource.%s", [key]), rec, resource[key]) if {
	is_object(resource[key])
} else := set()

# list_shape_problems: the same for every element of the array resource[key].
list_shape_problems(key, rec) := {sprintf("resource.%s is not an array", [key])} if {
	has_key(resource, key)
	not is_array(resource[key])
} else := {msg |
	some i, x in resource[key]
	some msg in element_problems(sprintf("resource.%s[%d]", [key, i]), rec, x)
}

element_problems(path, _, x) := {sprintf("%s is not an object", [path])} if not is_object(x)

element_problems(path, rec, x) := field_problems(path, rec, x) if {
	is_object(x)
	rec != "namespace"
}

# Namespaces: also the target and qos records inside.
element_problems(path, "namespace", x) := field_problems(path, "namespace", x) | {msg |
	some k, rec in {"target": "target", "qos": "qos"}
	is_object(x[k])
	some msg in field_problems(sprintf("%s.%s", [path, k]), rec, x[k])
} if is_object(x)

# --- Values -----------------------------------------------------------------

# valid_duration: a Go duration string time.ParseDuration and
# time.parse_duration_ns both accept without overflow: at most four
# components of at most five digits each, with Go's units.
valid_duration(s) if {
	is_string(s)
	regex.match(`^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|µs|ms|s|m|h)){1,4}$`, s)
}

# valid_time: an RFC 3339 time that time.parse_rfc3339_ns accepts, so that
# parsing it cannot fail the evaluation: a real calendar date in 1970-2261
# (February 29 in leap years only).
valid_time(s) if {
	is_string(s)
	regex.match(time_pattern, s)
	leap_day_ok(s)
}

time_pattern := concat("", [
	`^(19[7-9][0-9]|2[01][0-9][0-9]|22[0-5][0-9]|226[01])-`,
	`((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-9]))`,
	`T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`,
])

leap_day_ok(s) if {
	substring(s, 4, 6) != "-02-29"
} else if {
	leap_year(to_number(substring(s, 0, 4)))
}

leap_year(y) if {
	y % 4 == 0
	y % 100 != 0
}

leap_year(y) if y % 400 == 0

# time_ns: the RFC 3339 time s in nanoseconds, if it is valid.
time_ns(s) := time.parse_rfc3339_ns(s) if valid_time(s)

input_time_valid if valid_time(input.time)

# now_ns: the request's time (input.time), if it is valid.
now_ns := time_ns(input.time)

# expiry_ns: the job's expiry, if it is valid.
expiry_ns := time_ns(job.expires_at)
