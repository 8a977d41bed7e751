package nvmefmt

import (
	"crypto/sha256"
	"crypto/sha512"
	"fmt"
	"hash"
	"strconv"
)

// Hash is the two-digit hash identifier of the DHHC-1 and NVMeTLSkey-1
// formats, which is also the NVMe hash ID of DH-HMAC-CHAP and of PSK
// identities (NVMe Base spec, DH-HMAC-CHAP hash identifiers; NVMe/TCP
// transport spec, PSK interchange format).
type Hash uint8

// The hash identifiers. HashNone means "no transform": a DH-HMAC-CHAP secret
// is used as is, and a configured TLS PSK is its own retained PSK.
const (
	HashNone Hash = 0
	SHA256   Hash = 1
	SHA384   Hash = 2
	SHA512   Hash = 3
)

// String returns "none", "sha256", "sha384" or "sha512" (the names ParseHash
// accepts), or "Hash(N)" for an unknown identifier.
func (h Hash) String() string {
	switch h {
	case HashNone:
		return "none"
	case SHA256:
		return "sha256"
	case SHA384:
		return "sha384"
	case SHA512:
		return "sha512"
	}
	return "Hash(" + strconv.Itoa(int(h)) + ")"
}

// HMACName returns the kernel crypto name of the HMAC, as Linux nvmet's
// configfs attribute hosts/<hostnqn>/dhchap_hash takes it: "hmac(sha256)",
// "hmac(sha384)" or "hmac(sha512)". It returns "" for HashNone and unknown
// identifiers, which name no HMAC.
func (h Hash) HMACName() string {
	switch h {
	case SHA256, SHA384, SHA512:
		return "hmac(" + h.String() + ")"
	}
	return ""
}

// Size returns the digest size in bytes (32, 48 or 64), or 0 for HashNone and
// unknown identifiers.
func (h Hash) Size() int {
	switch h {
	case SHA256:
		return sha256.Size
	case SHA384:
		return sha512.Size384
	case SHA512:
		return sha512.Size
	}
	return 0
}

// newFunc returns the constructor of the hash; nil for HashNone and unknown
// identifiers. Callers validate h first.
func (h Hash) newFunc() func() hash.Hash {
	switch h {
	case SHA256:
		return sha256.New
	case SHA384:
		return sha512.New384
	case SHA512:
		return sha512.New
	}
	return nil
}

// ParseHash returns the Hash named "none", "sha256", "sha384" or "sha512"
// (lower case, as String prints them).
func ParseHash(name string) (Hash, error) {
	for h := HashNone; h <= SHA512; h++ {
		if name == h.String() {
			return h, nil
		}
	}
	return 0, fmt.Errorf("%w: %q is not one of none, sha256, sha384, sha512", ErrHash, name)
}
