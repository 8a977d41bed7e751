package attest

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Algorithm names a signature algorithm. The string is stable: it appears in
// exported key manifests and reports.
type Algorithm string

// Supported algorithms.
const (
	// Ed25519 is pure Ed25519 (RFC 8032) over the message: the default, and
	// the signature type of standard C2SP signed notes.
	Ed25519 Algorithm = "ed25519"
	// ECDSAP256 is ECDSA on NIST P-256 over SHA-256 of the message, ASN.1
	// DER signatures: the form of C2SP signed-note signature type 0x02 and
	// of Vault Transit's ecdsa-p256 keys.
	ECDSAP256 Algorithm = "ecdsa-p256"
)

// PublicKey is one version of a signing key as an offline verifier needs it:
// the algorithm, the key and the version the signer gave it. It never holds
// private material and may be exported freely.
type PublicKey struct {
	Algorithm Algorithm
	// Version is the key version: 1, 2, … for a local key directory, the
	// Vault Transit version for a Vault key, 0 if unknown (a key loaded from
	// a PEM file without a version in its name).
	Version uint64
	// Key is an ed25519.PublicKey or an *ecdsa.PublicKey on P-256.
	Key crypto.PublicKey

	der []byte             // SubjectPublicKeyInfo, DER
	v   signature.Verifier // sigstore verifier for Key
}

// NewPublicKey checks key and returns it as a PublicKey of the given version.
func NewPublicKey(key crypto.PublicKey, version uint64) (PublicKey, error) {
	var alg Algorithm
	var v signature.Verifier
	var err error
	switch k := key.(type) {
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return PublicKey{}, fmt.Errorf("%w: ed25519 public key of %d bytes", ErrMalformedKey, len(k))
		}
		alg = Ed25519
		v, err = signature.LoadED25519Verifier(k)
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return PublicKey{}, fmt.Errorf("%w: ECDSA on %s (only P-256)", ErrUnsupportedKey, k.Curve.Params().Name)
		}
		alg = ECDSAP256
		v, err = signature.LoadECDSAVerifier(k, crypto.SHA256)
	default:
		return PublicKey{}, fmt.Errorf("%w: %T", ErrUnsupportedKey, key)
	}
	if err != nil {
		return PublicKey{}, fmt.Errorf("load verifier: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		return PublicKey{}, fmt.Errorf("%w: %v", ErrMalformedKey, err)
	}
	return PublicKey{Algorithm: alg, Version: version, Key: key, der: der, v: v}, nil
}

// ParsePublicKeyPEM parses a PKIX "PUBLIC KEY" PEM block (as written by
// MarshalPEM, openssl pkey -pubout, or Vault Transit for ECDSA keys).
func ParsePublicKeyPEM(data []byte, version uint64) (PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return PublicKey{}, fmt.Errorf("%w: no PUBLIC KEY PEM block", ErrMalformedKey)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return PublicKey{}, fmt.Errorf("%w: %v", ErrMalformedKey, err)
	}
	return NewPublicKey(key, version)
}

// DER returns the key as a DER SubjectPublicKeyInfo.
func (p PublicKey) DER() []byte { return bytes.Clone(p.der) }

// MarshalPEM returns the key as a PKIX "PUBLIC KEY" PEM block.
func (p PublicKey) MarshalPEM() ([]byte, error) {
	if p.der == nil {
		return nil, fmt.Errorf("%w: zero PublicKey", ErrMalformedKey)
	}
	return cryptoutils.PEMEncode(cryptoutils.PublicKeyPEMType, p.der), nil
}

// KeyID identifies the key independently of any name: "sha256:" and the hex
// SHA-256 of its DER SubjectPublicKeyInfo (the same for every tool that
// hashes the SPKI, e.g. openssl pkey -pubout -outform DER | sha256sum).
func (p PublicKey) KeyID() string {
	sum := sha256.Sum256(p.der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Equal reports whether p and q are the same key (the versions may differ).
func (p PublicKey) Equal(q PublicKey) bool {
	return p.der != nil && bytes.Equal(p.der, q.der)
}

// Verify checks sig over msg: pure Ed25519, or ECDSA P-256 over SHA-256(msg)
// with an ASN.1 DER signature. It returns ErrBadSignature when it does not
// verify.
func (p PublicKey) Verify(msg, sig []byte) error {
	if p.v == nil {
		return fmt.Errorf("%w: zero PublicKey", ErrMalformedKey)
	}
	if err := p.v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(msg)); err != nil {
		return ErrBadSignature
	}
	return nil
}

// String describes the key without key material: algorithm, version, ID.
func (p PublicKey) String() string {
	return fmt.Sprintf("%s v%d %s", p.Algorithm, p.Version, p.KeyID())
}
