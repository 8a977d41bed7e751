// Package spdk is the driver of an SPDK nvmf_tgt, driven over its
// JSON-RPC 2.0 Unix socket:
//
//   - every secret is a file in KeyDir (0600), registered with
//     keyring_file_add_key under a content-derived name ("nvmegate-" and a
//     hash of subsystem, host, kind and secret), so a rotated key gets a
//     new name; names no host refers to any more are removed with
//     keyring_file_remove_key and their files deleted;
//   - nvmf_subsystem_add_host {nqn, host, dhchap_key, dhchap_ctrlr_key, psk}
//     admits a host with key names; nvmf_subsystem_set_keys re-keys its
//     DH-HMAC-CHAP keys in place; a PSK cannot change in place, so a host
//     whose PSK changes is removed and added again;
//     nvmf_subsystem_remove_host removes hosts no grant allows;
//   - namespace QoS caps go to the namespace's bdev (from
//     nvmf_get_subsystems) with bdev_set_qos_limit, once after a start and
//     then on change;
//   - SPDK does not combine in-band authentication with a secure channel:
//     a host with both a PSK and DH-HMAC-CHAP keys is refused;
//   - namespaces to encrypt at rest are not exported by this driver yet:
//     each is reported in a *fabric.NotServedError, and the rest of the
//     state is applied (hosts removed first), so that one namespace does
//     not hold back every tenant on the target.
//
// Subsystems, namespaces and listeners are the storage operator's: the
// driver only manages hosts and keys of subsystems that exist
// (nvmf_get_subsystems).
//
// Whole states and deltas: Apply takes a whole fabric.State, lists the
// target (nvmf_get_subsystems, keyring_get_keys) and converges it, QoS
// included. ApplyDelta takes a fabric.Delta — host entries added, re-keyed
// or removed on one subsystem each — and issues only those hosts' RPCs
// (their keys, then nvmf_subsystem_add_host, _set_keys or _remove_host,
// then keyring_file_remove_key of the keys they no longer use), lists
// nothing: it relies on the key names it gave each host, which it learnt
// from the whole state it applied. A delta before any whole state, after a
// failed application, or naming a subsystem that state lacks is refused
// with fabric.ErrNeedFull and the caller sends the whole state; deltas
// leave the target holding what Apply of the resulting state gives a
// fresh one (delta_test.go, against the JSON-RPC peer).
package spdk
