// Package keyring keeps NVMe/TCP TLS pre-shared keys in Linux kernel
// keyrings, where the kernel's NVMe host and target and the TLS handshake
// daemon (tlshd) look them up.
//
// Linux (6.7 and later) keeps NVMe PSKs as keys of type "psk" described by
// their PSK identity ("NVMe0R01 <hostnqn> <subnqn>", or the TP 8018 form
// with a digest). A target's PSKs live in the kernel's ".nvme" keyring,
// which nvmet passes to tlshd with every handshake it accepts; a host may
// keep its PSKs in a keyring of its own and name it in the connect options
// (keyring=, tls_key=). Adding a key whose type and description are already
// in the ring replaces its payload in place: the key keeps its serial, so a
// controller that names it reconnects with the new PSK.
//
// Payloads go to the kernel and nowhere else: nothing here logs, prints or
// keeps them.
package keyring
