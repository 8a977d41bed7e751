package nvmefmt

import "errors"

// Errors returned by the key formats and derivations of this package. Each is
// wrapped with a short context ("DHHC-1 key: ...") that names the failing
// part and, at most, lengths and positions: never a byte of a secret, its
// base64 text or its CRC. Test with errors.Is.
var (
	// ErrPrefix: the string does not start with "DHHC-1:" or
	// "NVMeTLSkey-1:" (case and version matter). The caller passed the wrong
	// kind of key or a newer format version; it cannot be repaired here.
	ErrPrefix = errors.New("nvmefmt: wrong key prefix")

	// ErrHash: the two-digit hash identifier after the prefix is malformed or
	// not allowed for the format (DHHC-1: 00-03; NVMeTLSkey-1: 00-02), or a
	// function was given a Hash it does not support (for example SHA-512 for
	// a TLS PSK). Choose a supported hash.
	ErrHash = errors.New("nvmefmt: unsupported hash")

	// ErrBase64: the key body is not canonical standard base64 with padding
	// (RFC 4648 §4): a character outside the alphabet, a line break, missing
	// padding or non-zero padding bits. The string was damaged in transit.
	ErrBase64 = errors.New("nvmefmt: malformed base64")

	// ErrLength: a secret has a length the format does not allow, either in
	// a decoded key or in a call (DH-HMAC-CHAP: 32, 48 or 64 bytes and, for
	// hash 01-03, exactly the hash size; TLS PSK: 32 or 48 bytes and, for
	// hash 01-02, exactly the hash size), or a key body longer than any key.
	ErrLength = errors.New("nvmefmt: wrong secret length")

	// ErrCRC: the CRC-32 appended to the secret does not match it; the key
	// was damaged or edited. Obtain the key again.
	ErrCRC = errors.New("nvmefmt: CRC-32 mismatch")

	// ErrTrailer: the key does not end with exactly one ':' right after its
	// base64 body (a missing colon, a second field, a trailing newline).
	// Trim whitespace before parsing; anything else is a damaged key.
	ErrTrailer = errors.New("nvmefmt: malformed key trailer")

	// ErrNQN: an NQN passed to a derivation is empty, longer than 223 bytes,
	// or contains a space or an ASCII control character (a space would split
	// a PSK identity, a NUL would truncate it in C), or the two NQNs make a
	// v0 PSK identity longer than the 255 bytes an HKDF label context holds.
	// Only these rules are checked here, not NQN syntax.
	ErrNQN = errors.New("nvmefmt: unusable NQN")

	// ErrDigest: a PSK digest given to TLSPSK is not the base64 of a hash
	// of the right size (44 characters for SHA-256, 64 for SHA-384).
	ErrDigest = errors.New("nvmefmt: malformed PSK digest")

	// ErrSPIFFEID: HostNQNFromSPIFFEID was given something that is not the
	// SPIFFE ID of a workload (spiffe://<trust domain>/<path>).
	ErrSPIFFEID = errors.New("nvmefmt: not a SPIFFE ID")

	// ErrConnection wraps every validation error of a Connection; the
	// message names the field, never a secret.
	ErrConnection = errors.New("nvmefmt: invalid connection")
)
