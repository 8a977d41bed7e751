package nvmegate.authz_test

# Fixtures shared by the *_test.rego files: inputs built as the gateway
# builds them (policy/README.md), which each test changes in one place.

import data.nvmegate.authz

td := "example.org"

now := "2026-10-01T12:00:00Z"

sub_nqn := "nqn.2026-01.org.example:acme-train"

host_nqn := "nqn.2014-08.org.nvmexpress:uuid:0c6f2d46-2b8c-5b0e-9b7a-6a3e2b1d7f10"

caller(role, path, tenant, name) := {
	"id": concat("", ["spiffe://", td, path]),
	"trust_domain": td,
	"role": role,
	"tenant": tenant,
	"name": name,
}

admin := caller("admin", "/admin/alice", "", "alice")

auditor := caller("auditor", "/auditor/eve", "", "eve")

scheduler := caller("scheduler", "/tenant/acme/scheduler/slurm", "acme", "slurm")

globex_scheduler := caller("scheduler", "/tenant/globex/scheduler/slurm", "globex", "slurm")

node := caller("node", "/node/gpu-01", "", "gpu-01")

node2_id := "spiffe://example.org/node/gpu-02"

target_agent := caller("target", "/target/t1", "", "t1")

gateway_peer := caller("gateway", "/gateway/gw-2", "", "gw-2")

unknown := caller("unknown", "/workload/x", "", "")

services := {
	"inventory": "nvmegate.v1.Inventory",
	"jobs": "nvmegate.v1.Jobs",
	"access": "nvmegate.v1.Access",
	"keys": "nvmegate.v1.Keys",
	"audit": "nvmegate.v1.Audit",
	"policy": "nvmegate.v1.Policy",
	"health": "grpc.health.v1.Health",
	"server_reflection": "grpc.reflection.v1.ServerReflection",
	"target": "nvmegate.v1.Target",
}

# req is the input of caller c performing action on resource.
req(c, action, resource) := {
	"caller": c,
	"rpc": {
		"service": services[split(action, ".")[0]],
		"method": split(action, ".")[1],
		"full_method": concat("", ["/", services[split(action, ".")[0]], "/", split(action, ".")[1]]),
	},
	"action": action,
	"resource": resource,
	"time": now,
	"gateway": {"trust_domain": td},
}

target_rec := {"id": "t1", "region": "eu-west", "fabric": "f1", "driver": "nvmet"}

subsystem_rec := {"nqn": sub_nqn, "tenant": "acme", "target_id": "t1", "dhchap": true, "tls": true}

# ns(nsid, patch): namespace nsid of subsystem sub_nqn, with patch merged in.
ns(nsid, patch) := object.union(
	{
		"subsystem_nqn": sub_nqn, "nsid": nsid, "tenant": "acme", "region": "eu-west", "data_class": "internal",
		"dataset": {"name": "common-crawl/2026-10", "digest": "sha256:ab"},
		"qos": {"max_iops": 0, "max_mbps": 0},
		"mode": "ro",
		"target": {"id": "t1", "region": "eu-west", "fabric": "f1"},
	},
	patch,
)

job_rec := {
	"job_id": "j1", "tenant": "acme", "scheduler": scheduler.id,
	"nodes": [node.id, node2_id], "allowed_regions": ["eu-west"],
	"expires_at": "2026-10-02T00:00:00Z", "state": "active",
}

binding := {"spiffe_id": node.id, "host_nqn": host_nqn, "tenant": "acme", "bound": true}

# connect(patch): node connects to sub_nqn in job j1; patch is merged into
# input.resource (objects merge, arrays replace).
connect(patch) := req(node, "access.connect", object.union(
	{
		"kind": "subsystem", "tenant": "acme",
		"target": target_rec, "subsystem": subsystem_rec,
		"namespaces": [ns(1, {})],
		"job": job_rec, "host_binding": binding,
		"request": {"host_nqn": host_nqn, "ttl": "", "mode": ""},
	},
	patch,
))

# node_call(action, patch): another job-scoped node action, like connect.
node_call(action, patch) := object.union(connect(patch), {"action": action})

# admit(patch): acme's scheduler admits job j1 for gpu-01 (bound to acme)
# and gpu-02 (unbound).
admit(patch) := req(scheduler, "jobs.admit", object.union(
	{
		"kind": "job", "tenant": "acme",
		"namespaces": [ns(1, {"mode": "rw"})],
		"job": object.union(job_rec, {"state": "requested"}),
		"nodes": [
			binding,
			{"spiffe_id": node2_id, "host_nqn": "nqn.2014-08.org.nvmexpress:uuid:5d1e3c52-4a8e-5f0b-8c9d-2e4f6a8b0c1d", "tenant": "", "bound": false},
		],
	},
	patch,
))

decide(x) := d if {
	d := authz.decision with input as x
}

allowed(d) if {
	d.allow == true
	count(d.reasons) == 1
}

denied(d) if {
	d.allow == false
	count(d.reasons) > 0
	d.obligations == {}
}

denied_with(d, reason) if {
	denied(d)
	reason in d.reasons
}
