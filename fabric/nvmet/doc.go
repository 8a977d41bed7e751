// Package nvmet is the fabric.Driver of the Linux kernel NVMe target: it
// writes the nvmet configfs tree (normally /sys/kernel/config/nvmet) as the
// kernel reads it (drivers/nvme/target/configfs.c):
//
//	hosts/<hostnqn>/{dhchap_key, dhchap_ctrl_key, dhchap_hash, dhchap_dhgroup}
//	subsystems/<nqn>/attr_allow_any_host                  "0"
//	subsystems/<nqn>/allowed_hosts/<hostnqn> -> ../../../hosts/<hostnqn>
//	ports/<id>/addr_{trtype, adrfam, traddr, trsvcid, treq}, and addr_tsas on TLS ports
//	ports/<id>/subsystems/<nqn> -> ../../../subsystems/<nqn>
//
// The driver owns the hosts, allowed_hosts links and port links of the
// subsystems it is given; namespaces and their backing devices are the
// storage operator's. Apply writes an attribute only when its content
// differs (writing a DH-HMAC-CHAP key to configfs re-keys the host), and
// removes hosts no subsystem allows any more, unlinking them first as
// configfs requires.
//
// Linux nvmet has no per-namespace QoS: the state's namespace caps are not
// enforced by this driver (fabric/spdk enforces them).
//
// On a plain directory (tests, and the demo's .demo/configfs) the same
// calls build the same tree; secrets are written 0600.
package nvmet
