package nvmegate.authz_test

import data.nvmegate.authz

eu_ns(region, target_region, fabric) := {
	"subsystem_nqn": "nqn.2026-01.org.example:acme-train", "nsid": 1, "tenant": "acme", "region": region,
	"data_class": "restricted", "dataset": {"name": "d", "digest": "sha256:ab"}, "qos": {"max_iops": 0, "max_mbps": 0},
	"mode": "", "target": {"id": "t1", "region": target_region, "fabric": fabric},
}

test_compliance_residency_kept if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-central", "f1")]}
	c.namespaces[0].residency_problems == []
}

test_compliance_residency_broken if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "us-east", "f1"), eu_ns("eu-sovereign", "eu-central", "f1")]}
	c.namespaces[0].residency_problems == ["namespace nqn.2026-01.org.example:acme-train/1 (region eu-west) may not be served from target t1 in region us-east"]
	c.namespaces[1].residency_problems == ["namespace nqn.2026-01.org.example:acme-train/1 (region eu-sovereign) may not be served over fabric f1"]
}

test_compliance_rotation_period_of_class if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-west", "f1")]}
		with data.nvmegate.classes as {"restricted": {"rotate_every": "24h"}}
	c.namespaces[0].rotate_every == "24h"
}

test_compliance_rotation_period_default if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-west", "f1")]}
		with data.nvmegate.classes as {"restricted": {}}
		with data.nvmegate.default_obligations as {"rotate_every": "720h"}
	c.namespaces[0].rotate_every == "720h"
}

test_compliance_no_rotation_period if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-west", "f1")]}
		with data.nvmegate.classes as {"restricted": {}}
		with data.nvmegate.default_obligations as {}
	c.namespaces[0].rotate_every == ""
}

test_compliance_reencryption_period if {
	c := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-west", "f1")]}
		with data.nvmegate.classes as {"restricted": {"reencrypt_every": "8760h"}}
		with data.nvmegate.default_obligations as {"reencrypt_every": "1h"}
	c.namespaces[0].reencrypt_every == "8760h"
	d := authz.compliance with input as {"namespaces": [eu_ns("eu-west", "eu-west", "f1")]}
		with data.nvmegate.classes as {"restricted": {}}
		with data.nvmegate.default_obligations as {}
	d.namespaces[0].reencrypt_every == ""
}

# reencrypt_every is no grant's obligation: it never reaches a decision.
test_reencryption_period_not_an_obligation if {
	not "reencrypt_every" in object.keys(authz.class_set_obligations({"restricted"}, {"dhchap": true, "tls": true}).obligations)
		with data.nvmegate.classes as {"restricted": {"reencrypt_every": "8760h", "max_ttl": "1h"}}
}
