// Package nvmet is the driver of the Linux kernel NVMe target: it
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
// Whole states and deltas: Apply takes a whole fabric.State (the agent
// sends one at start, after a reconnect, after an inventory change, on its
// periodic reconcile and after any failure) and converges the tree to it;
// an unchanged state is not walked again within Recheck. ApplyDelta takes
// a fabric.Delta — host entries added, re-keyed or removed on one
// subsystem each — and touches only those hosts: their hosts/<nqn> entry
// and their allowed_hosts links, nothing else read. The driver remembers
// the host side of what it applied (each host's credential digest and the
// subsystems allowing it), so a delta is checked as Apply checks a state —
// one set of credentials per host across the target's subsystems, a
// DH-HMAC-CHAP key on every host — before anything is written, and a host
// whose controller key goes is made anew and linked again everywhere it
// stays. A delta before any whole state, after a failed application, or
// naming a subsystem the applied state lacks is refused with
// fabric.ErrNeedFull and the caller sends the whole state: deltas applied
// to the state they were computed from leave exactly the tree Apply of the
// resulting state makes (delta_test.go checks this on random sequences).
//
// Namespaces with a backing device are the driver's own: exported through
// a dm-crypt mapping keyed with the namespace's data key (namespace.go).
// Apply writes them last, after every host and port, and one the target
// cannot serve (no cryptsetup, cryptsetup refusing it, a device not wholly
// under its key) is left not exported — never in the clear — and reported
// in a *fabric.NotServedError while the rest of the state is applied:
// hosts removed first, then added, and deltas taken on top. One namespace
// must not stall the programming of every tenant on the target (issue 29,
// defect 5). A held namespace (no data key: the gateway's key store is
// away) is kept as the target has it, never opened anew.
//
// Linux nvmet has no per-namespace QoS: the state's namespace caps are not
// enforced by this driver (fabric/spdk enforces them).
//
// On a plain directory (tests, and the demo's .demo/configfs) the same
// calls build the same tree; secrets are written 0600.
package nvmet
