package keys

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// Labels of the derivations (HKDF info prefixes). Changing one changes
// every credential: they are part of the format.
const (
	labelHost        = "nvmegate/v1 dhchap host secret"
	labelCtrl        = "nvmegate/v1 dhchap controller secret"
	labelTLS         = "nvmegate/v1 tls configured psk"
	labelFingerprint = "nvmegate/v1 fingerprint key"
)

// CredentialParams select the formats of derived credentials, as the
// policy's obligations and the subsystem's settings ask.
type CredentialParams struct {
	// DHCHAPHash is the transform hash of the DH-HMAC-CHAP secrets
	// (SHA256, SHA384 or SHA512); the secrets are that hash's size.
	// HashNone means no DH-HMAC-CHAP secrets.
	DHCHAPHash nvmefmt.Hash
	// Bidirectional also derives the controller secret.
	Bidirectional bool
	// TLSHash is the PSK hash of the configured TLS PSK (SHA256 or
	// SHA384); HashNone means no TLS PSK.
	TLSHash nvmefmt.Hash
}

// ParamsFor are the credential parameters of a grant whose DH-HMAC-CHAP
// hash is dhchapHash ("sha256", "sha384", "sha512" or "none"), with a
// controller secret if bidirectional and a TLS PSK if tls: the PSK's hash
// is SHA-384 beside a SHA-384 or SHA-512 DH-HMAC-CHAP hash, else SHA-256.
// Whoever derives a grant's credentials (the lease issuing it, the target
// agent programming it) derives them with these.
func ParamsFor(dhchapHash string, bidirectional, tls bool) (CredentialParams, error) {
	h, err := nvmefmt.ParseHash(dhchapHash)
	if err != nil {
		return CredentialParams{}, err
	}
	p := CredentialParams{DHCHAPHash: h, Bidirectional: bidirectional}
	if tls {
		p.TLSHash = nvmefmt.SHA256
		if h == nvmefmt.SHA384 || h == nvmefmt.SHA512 {
			p.TLSHash = nvmefmt.SHA384
		}
	}
	return p, nil
}

// Credentials are a host's secrets for one subsystem, in the NVMe
// interchange formats, and their fingerprints for the audit log. They print
// redacted; only the fields themselves hold the secrets.
type Credentials struct {
	RootVersion uint64
	HostSecret  string // DHHC-1:…, "" if not asked for
	CtrlSecret  string // DHHC-1:…, "" unless bidirectional
	TLSPSK      string // NVMeTLSkey-1:…, "" if not asked for

	// Fingerprints (keyed hashes), never the secrets.
	RootFingerprint       string
	HostSecretFingerprint string
	CtrlSecretFingerprint string
	TLSPSKFingerprint     string
}

// String redacts the secrets.
func (c Credentials) String() string {
	return fmt.Sprintf("credentials from root v%d (host %s, ctrl %s, tls %s; secrets redacted)",
		c.RootVersion, orNone(c.HostSecretFingerprint), orNone(c.CtrlSecretFingerprint), orNone(c.TLSPSKFingerprint))
}

// GoString redacts the secrets for %#v.
func (c Credentials) GoString() string { return c.String() }

// LogValue redacts the secrets in slog output.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// Derive computes a host's credentials for a subsystem from one root
// version. It is a pure function of its arguments: every gateway derives
// the same secrets, and the targets are programmed with exactly these.
func Derive(r Root, hostNQN, subNQN string, p CredentialParams) (Credentials, error) {
	if len(r.Secret) != RootSize || r.Version == 0 {
		return Credentials{}, fmt.Errorf("%w: root v%d is malformed", ErrInvalid, r.Version)
	}
	if hostNQN == "" || subNQN == "" {
		return Credentials{}, fmt.Errorf("%w: host and subsystem NQNs are required", ErrInvalid)
	}
	fpKey, err := derive(r, labelFingerprint, "", "", sha256.Size)
	if err != nil {
		return Credentials{}, err
	}
	c := Credentials{RootVersion: r.Version, RootFingerprint: fingerprint(fpKey, []byte("root"))}
	if p.DHCHAPHash != nvmefmt.HashNone {
		n := p.DHCHAPHash.Size()
		if n == 0 {
			return Credentials{}, fmt.Errorf("%w: DH-HMAC-CHAP hash %s", ErrInvalid, p.DHCHAPHash)
		}
		if c.HostSecret, c.HostSecretFingerprint, err = derivedDHCHAP(r, fpKey, labelHost, hostNQN, subNQN, p.DHCHAPHash, n); err != nil {
			return Credentials{}, err
		}
		if p.Bidirectional {
			if c.CtrlSecret, c.CtrlSecretFingerprint, err = derivedDHCHAP(r, fpKey, labelCtrl, hostNQN, subNQN, p.DHCHAPHash, n); err != nil {
				return Credentials{}, err
			}
		}
	} else if p.Bidirectional {
		return Credentials{}, fmt.Errorf("%w: bidirectional authentication needs a DH-HMAC-CHAP hash", ErrInvalid)
	}
	if p.TLSHash != nvmefmt.HashNone {
		if p.TLSHash != nvmefmt.SHA256 && p.TLSHash != nvmefmt.SHA384 {
			return Credentials{}, fmt.Errorf("%w: TLS PSK hash must be sha256 or sha384, got %s", ErrInvalid, p.TLSHash)
		}
		psk, err := derive(r, labelTLS, hostNQN, subNQN, p.TLSHash.Size())
		if err != nil {
			return Credentials{}, err
		}
		if c.TLSPSK, err = nvmefmt.EncodeTLSPSK(p.TLSHash, psk); err != nil {
			return Credentials{}, err
		}
		c.TLSPSKFingerprint = fingerprint(fpKey, psk)
	}
	return c, nil
}

func derivedDHCHAP(r Root, fpKey []byte, label, hostNQN, subNQN string, h nvmefmt.Hash, n int) (string, string, error) {
	secret, err := derive(r, label, hostNQN, subNQN, n)
	if err != nil {
		return "", "", err
	}
	s, err := nvmefmt.EncodeDHCHAP(h, secret)
	if err != nil {
		return "", "", err
	}
	return s, fingerprint(fpKey, secret), nil
}

// derive is HKDF-SHA-256 with the root as input key material and an info
// string that separates the label, both NQNs and the version (NUL-joined:
// NQNs cannot contain NUL).
func derive(r Root, label, hostNQN, subNQN string, n int) ([]byte, error) {
	info := label + "\x00" + hostNQN + "\x00" + subNQN + "\x00" + strconv.FormatUint(r.Version, 10)
	return hkdf.Key(sha256.New, r.Secret, nil, info, n)
}

// fingerprint is a keyed hash naming secret in the audit log:
// "hmac-sha256:" and the first 128 bits, hex.
func fingerprint(key, secret []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(secret)
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)[:16])
}

// RootFingerprint names a root version in the audit log.
func RootFingerprint(r Root) string {
	fpKey, err := derive(r, labelFingerprint, "", "", sha256.Size)
	if err != nil {
		return ""
	}
	return fingerprint(fpKey, []byte("root"))
}
