// Package nvmefmt encodes, decodes and derives the NVMe credentials nvmegate
// hands to hosts and targets, byte for byte as the Linux kernel, SPDK,
// libnvme and nvme-cli read them. It has no state and no I/O; keys come in and
// go out as values, and nothing here logs.
//
// # DH-HMAC-CHAP secrets
//
// The secret representation of the NVMe Base spec (in-band authentication)
// is
//
//	DHHC-1:<hh>:<base64(secret || CRC-32)>:
//
// hh is the hash of the transform HMAC_hh(secret, NQN || "NVMe-over-Fabrics")
// applied at authentication time (00 none, 01 SHA-256, 02 SHA-384, 03
// SHA-512; TransformDHCHAP), the CRC-32 is the IEEE one of the secret,
// appended little-endian, and base64 is the standard alphabet with padding.
// EncodeDHCHAP and ParseDHCHAP write and read it; Hash.HMACName gives the
// "hmac(sha256)" names of Linux nvmet's configfs. The string is the shared
// secret: host and target must hold the identical string.
//
// # NVMe/TCP TLS PSKs
//
// The PSK interchange format of the NVMe/TCP transport spec (TP 8018) is
//
//	NVMeTLSkey-1:<hh>:<base64(psk || CRC-32)>:
//
// with hh the hash that turns the configured PSK into a retained PSK (00:
// none, the configured PSK is used as is; 01 SHA-256; 02 SHA-384).
// EncodeTLSPSK and ParseTLSPSK write and read it. From a configured PSK and
// the two NQNs follow, per TP 8018 (DeriveTLS does all of it):
//
//   - the retained PSK, RetainedPSK: HKDF-Expand-Label(HKDF-Extract(zeros,
//     configured), "HostNQN", hostnqn, len(configured));
//   - the PSK identities, IdentityV0 "NVMe0R<hh> <hostnqn> <subnqn>" and
//     IdentityV1 "NVMe1R<hh> <hostnqn> <subnqn> <digest>", the digest being
//     base64(HMAC_hh(retained, hostnqn || " " || subnqn || " " ||
//     "NVMe-over-Fabrics")) (PSKDigest);
//   - the TLS PSK stored under an identity in the kernel's .nvme keyring:
//     HKDF-Expand-Label(HKDF-Extract(zeros, retained), "nvme-tls-psk",
//     context, hash size), with context "<hh> <digest>" for v1 (TLSPSK) and
//     the whole identity for v0 (TLSPSKV0).
//
// Here hh is the cipher-suite hash (TLSKey.Cipher): the key's own hash for 01
// and 02, and for 00 SHA-256 or SHA-384 by PSK length, as libnvme and SPDK
// choose. HKDF-Expand-Label uses the HkdfLabel of RFC 8446 §7.1: a big-endian
// uint16 length, then "tls13 "+label and the context, each after a length
// byte. That is what the spec, SPDK, libnvme 1.16 / nvme-cli 2.16 and later,
// and the kernel compute (the kernel derives only TLS PSKs of generated PSKs,
// for secure channel concatenation, and omitted the length bytes there until
// the 2025 patch "nvme-auth: use hkdf_expand_label()").
//
// # The compat encoding
//
// libnvme up to 1.15 (nvme-cli up to 2.15) built the HkdfLabel differently:
// the length in host byte order (little-endian on the usual hosts), and
// "tls13 "+label and the context concatenated with no length bytes. Retained
// PSKs, v1 digests and TLS PSKs from those versions therefore differ from the
// spec's. The fix (libnvme fde6b1f5, "libnvme: TLS PSK derivation fixes")
// first shipped in libnvme 1.16; an earlier attempt was reverted before 1.15.
// libnvme 1.16 kept the old encoding as nvme_*_compat functions, and
// this package offers it, little-endian, behind the explicit CompatLabels
// option, checked against libnvme's compat vectors. We emit RFC 8446 unless a
// caller asks. nvme-cli 2.3 with libnvme 1.3 (Debian 12) derives no TLS keys
// at all; its check-tls-key only validates the interchange string.
//
// # Decisions where the sources differ
//
//   - Secret length against hh (DH-HMAC-CHAP). The kernel accepts any of 32,
//     48 or 64 bytes whatever hh says (nvme_auth_extract_key); nvme-cli's
//     gen-dhchap-key and check-dhchap-key (2.3 through 2.15) require exactly
//     the hash size for 01-03. We follow nvme-cli, the strictest reader, in
//     both directions.
//   - Hash 00 for TLS PSKs. The spec, SPDK and libnvme's importer accept a
//     32- or 48-byte PSK with 00; nvme-cli 2.3's check-tls-key refuses any hh
//     but 01 and 02. We accept and emit 00 and document that old nvme-cli
//     rejects it; nvmegate itself generates 01 or 02 keys. 03 is refused:
//     TLS 1.3 has no SHA-512 PSK cipher suite.
//   - Strictness. Readers differ in what else they let through (the kernel
//     takes a missing final ':' and reads hh as decimal; nvme-cli 2.3 takes
//     base64 with non-zero padding bits). We accept only the canonical form,
//     so that a parsed key re-encodes to the same string: exact prefix,
//     two-digit hh, padded standard base64 with zero padding bits and no line
//     breaks, one final ':' and nothing after it. Callers trim whitespace
//     first.
//   - The transformed DH-HMAC-CHAP key has the hash size, whatever the secret
//     length (the kernel's nvme_auth_transform_key).
//   - v0 TLS PSK. libnvme (derive_tls_key) and SPDK (nvme_tcp_derive_tls_psk)
//     both use the v0 identity as the HKDF context, so TLSPSKV0 does; an
//     identity longer than the 255 bytes a context holds is refused, as both
//     refuse it.
//   - NQNs are not checked for NQN syntax here (libnvme's own vectors use
//     "nqn.psk-test-host"), only for being usable: non-empty, at most 223
//     bytes, no spaces (they would split an identity) and no ASCII control
//     characters (a NUL would truncate the NQN in C).
//
// # Secrets
//
// Errors name the failing part and lengths, never a byte of a key, its base64
// text or its CRC. DHCHAPKey, TLSKey and TLSCredentials print redacted with
// fmt and slog; only the Encode functions reveal a secret.
//
// # Sources
//
//   - NVMe Base spec 2.0 §8.13 (in-band authentication, DH-HMAC-CHAP) and
//     TP 8018 / NVMe/TCP transport spec §3.6.1 (PSK interchange format,
//     identities, derivations; §3.6.1.3 as the kernel cites it).
//   - Linux drivers/nvme/common/auth.c (nvme_auth_extract_key,
//     nvme_auth_transform_key, nvme_auth_generate_digest,
//     nvme_auth_derive_tls_psk), drivers/nvme/common/keyring.c, and the
//     KUnit vectors in drivers/nvme/common/tests/auth_kunit.c.
//   - libnvme src/nvme/linux.c and test/psk.c (linux-nvme/libnvme);
//     nvme-cli nvme.c gen-dhchap-key, check-dhchap-key, gen-tls-key,
//     check-tls-key (linux-nvme/nvme-cli, v2.3 and v2.15).
//   - SPDK include/spdk_internal/nvme_tcp.h (interchange parsing, retained
//     and TLS PSK derivation).
//   - RFC 5869 (HKDF), RFC 8446 §7.1 (HKDF-Expand-Label), RFC 8448 (traces),
//     RFC 4648 (base64).
//
// The tests reproduce the published vectors of these sources and, where
// nvme-cli is installed, use it as an oracle.
package nvmefmt
