// Package attest holds nvmegate's signing keys and signatures: signers and
// offline verifiers (through sigstore's signature package), the adapter that
// makes C2SP signed notes (the audit log's checkpoints) with them, and the
// export of the public key of every key version, because an auditor
// verifying offline cannot ask Vault for an old one.
//
// # Signers
//
// A Signer signs with one version of a key and says which (PublicKey):
//
//   - LocalSigner: a private key in memory. Ed25519 (the default) signs the
//     message itself (RFC 8032); ECDSA P-256 signs SHA-256 of the message,
//     ASN.1 DER.
//   - KeyDir: a directory of versioned local key files, v<N>.key, each an
//     unencrypted PKCS#8 "PRIVATE KEY" PEM file, mode 0600, in a 0700
//     directory; LoadKeyFile refuses files others may read. The highest
//     version signs; Rotate adds one.
//   - VaultSigner: a Vault Transit key (type ed25519 or ecdsa-p256) through
//     sigstore's hashivault provider. It pins the latest version when made
//     (or on Refresh) and has Vault sign with exactly that version, so the
//     version recorded with a signature is the one that made it; PublicKeys
//     lists every version's public key.
//
// # Signed notes (c2sp.org/signed-note)
//
// NoteSigner adapts a Signer to golang.org/x/mod/sumdb/note.Signer, and
// PublicKey.NoteVerifier gives the matching note.Verifier. Key IDs:
//
//	Ed25519 (type 0x01): SHA-256(name || 0x0A || 0x01 || 32-byte key)[:4],
//	                     the standard one; x/mod's note.NewVerifier accepts
//	                     the verifier key lines this package writes.
//	ECDSA   (type 0x02): SHA-256(DER SubjectPublicKeyInfo)[:4], signature
//	                     ASN.1 DER over SHA-256(text): the form C2SP assigns
//	                     to type 0x02 ("as implemented by
//	                     transparency-dev/witness"), also used by Rekor.
//
// A verifier key line is "<name>+<key ID, 8 hex>+<base64(type || key)>",
// the key being 32 raw bytes for Ed25519 and the SPKI DER for ECDSA.
//
// # Public key export
//
// WritePublicKeys writes v<N>.pem (PKIX "PUBLIC KEY") and v<N>.vkey (the
// verifier key line under the log's origin) for every version;
// LoadPublicKeyFile and LoadPublicKeyDir read them back. Nothing in this
// package writes private key material anywhere but a key file, and no error
// or String method includes any.
//
// The per-job lineage attestations of DESIGN §8 (in-toto Statements in
// DSSE envelopes) are to be built on these signers.
package attest
