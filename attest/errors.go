package attest

import "errors"

// Sentinel errors. None of them, nor any error this package returns, carries
// key material: messages name files, algorithms and versions only.
var (
	// ErrUnsupportedKey is returned for a key of an algorithm this package
	// does not sign or verify with (anything but Ed25519 and ECDSA P-256).
	// Generate a key of a supported algorithm.
	ErrUnsupportedKey = errors.New("unsupported key algorithm")

	// ErrBadSignature is returned by PublicKey.Verify when a signature does
	// not verify under the key. The signed data or the signature was altered,
	// or another key signed it.
	ErrBadSignature = errors.New("signature does not verify")

	// ErrKeyFilePermissions is returned by LoadKeyFile for a private key file
	// that group or others may read or write. Fix the mode (chmod 600); the
	// key may have leaked and should be rotated.
	ErrKeyFilePermissions = errors.New("private key file is accessible to group or others")

	// ErrMalformedKey is returned when a PEM file, verifier key line or key
	// file name cannot be parsed.
	ErrMalformedKey = errors.New("malformed key")

	// ErrNoKeys is returned by OpenKeyDir(create=false) for a directory
	// without key files.
	ErrNoKeys = errors.New("no signing key in directory")
)
