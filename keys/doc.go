// Package keys is nvmegate's key hierarchy (DESIGN §5):
//
//   - per scope, a versioned access-credential root (32 random bytes). The
//     scope is the subsystem NQN, or "target:<id>" for an nvmet target
//     (nvmet keys a host once per target, not per subsystem). The
//     DH-HMAC-CHAP host and controller secrets and the configured NVMe/TCP
//     TLS PSK of a host are derived from it with HKDF-SHA-256 and
//     domain-separated labels, per (host NQN, scope, root version): 10,000
//     hosts cost no writes to the key store;
//   - per namespace, a data-encryption key stored only wrapped by the
//     namespace's key-encryption key (Vault Transit, or the local store's),
//     rotated by rotating the KEK and rewrapping;
//   - fingerprints: keyed hashes that name a key version or a credential in
//     the audit log without revealing it.
//
// A Manager serves credentials from roots cached in memory and refreshed in
// the background, so a connect never waits on the key store; past a
// staleness bound it refuses to issue (ErrUnavailable) rather than serve
// roots it cannot confirm. It rotates roots on a schedule, on demand and on
// revocation; superseded versions stay usable for a grace period, then are
// refused (ErrExpired).
//
// Storage is a Backend: keys/vaultstore (HashiCorp Vault: KV v2 with
// check-and-set for roots, Transit for wrapping) or keys/localstore (bbolt
// sealed with AES-256-GCM under a key file). Both pass the conformance suite
// in keys/keystest.
//
// Key material never appears in errors, logs, metrics or audit entries:
// Root and Credentials print redacted.
package keys
