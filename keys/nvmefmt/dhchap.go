package nvmefmt

import (
	"bytes"
	"crypto/hmac"
	"fmt"
	"io"
	"log/slog"
)

const (
	dhchapPrefix = "DHHC-1:"
	dhchapKind   = "DHHC-1 key"
	// fabricsSeed ends the HMAC input of the DH-HMAC-CHAP key transform and
	// of the PSK digest.
	fabricsSeed = "NVMe-over-Fabrics"
)

// DHCHAPKey is a DH-HMAC-CHAP secret: the bytes of a DHHC-1 string and the
// hash of the transform applied to it at authentication time. fmt and slog
// print it redacted; only EncodeDHCHAP shows the secret.
type DHCHAPKey struct {
	Hash   Hash
	Secret []byte
}

// EncodeDHCHAP returns the DH-HMAC-CHAP secret representation
// "DHHC-1:<hh>:<base64(secret || CRC-32)>:". secret must be 32, 48 or 64
// bytes for HashNone and exactly h.Size() bytes otherwise, as nvme-cli's
// gen-dhchap-key and check-dhchap-key require.
func EncodeDHCHAP(h Hash, secret []byte) (string, error) {
	if err := checkDHCHAP(h, len(secret)); err != nil {
		return "", err
	}
	return encode(dhchapPrefix, h, secret), nil
}

// Encode is EncodeDHCHAP(k.Hash, k.Secret).
func (k DHCHAPKey) Encode() (string, error) { return EncodeDHCHAP(k.Hash, k.Secret) }

// ParseDHCHAP decodes a DHHC-1 string strictly: the prefix, a hash identifier
// 00-03, canonical padded base64, a secret length allowed for that hash (see
// EncodeDHCHAP), the CRC-32 and exactly one final ':', in that order. Errors
// wrap ErrPrefix, ErrHash, ErrTrailer, ErrBase64, ErrLength or ErrCRC and
// never contain key material. An accepted string re-encodes identically.
func ParseDHCHAP(s string) (DHCHAPKey, error) {
	h, raw, err := parse(s, dhchapPrefix, dhchapKind, SHA512)
	if err != nil {
		return DHCHAPKey{}, err
	}
	if err := checkDHCHAP(h, len(raw)-crcLen); err != nil {
		clear(raw)
		return DHCHAPKey{}, err
	}
	secret, err := checkCRC(raw, dhchapKind)
	if err != nil {
		clear(raw)
		return DHCHAPKey{}, err
	}
	return DHCHAPKey{Hash: h, Secret: secret}, nil
}

// TransformDHCHAP returns the transformed key Kh' = HMAC_hh(secret, nqn ||
// "NVMe-over-Fabrics") that DH-HMAC-CHAP uses at authentication time (Linux
// nvme_auth_transform_key), nqn being the host NQN for a host secret and the
// subsystem NQN for a controller secret. The result has the hash size; for
// HashNone it is a copy of the secret.
func TransformDHCHAP(k DHCHAPKey, nqn string) ([]byte, error) {
	if err := checkDHCHAP(k.Hash, len(k.Secret)); err != nil {
		return nil, err
	}
	if err := checkNQN("NQN", nqn); err != nil {
		return nil, err
	}
	if k.Hash == HashNone {
		return bytes.Clone(k.Secret), nil
	}
	m := hmac.New(k.Hash.newFunc(), k.Secret)
	io.WriteString(m, nqn)
	io.WriteString(m, fabricsSeed)
	return m.Sum(nil), nil
}

// checkDHCHAP enforces the secret lengths of nvme-cli check-dhchap-key, the
// strictest reader: 32, 48 or 64 bytes for 00, the hash size otherwise.
func checkDHCHAP(h Hash, n int) error {
	switch h {
	case HashNone:
		if n != 32 && n != 48 && n != 64 {
			return fmt.Errorf("%w: %s secret of %d bytes; hash none takes 32, 48 or 64", ErrLength, dhchapKind, n)
		}
	case SHA256, SHA384, SHA512:
		if n != h.Size() {
			return fmt.Errorf("%w: %s secret of %d bytes; hash %s takes %d", ErrLength, dhchapKind, n, h, h.Size())
		}
	default:
		return fmt.Errorf("%w: %s with hash %s", ErrHash, dhchapKind, h)
	}
	return nil
}

// String describes the key without its secret.
func (k DHCHAPKey) String() string { return redacted("nvmefmt.DHCHAPKey", k.Hash, len(k.Secret)) }

// Format prints the key redacted for every verb, %#v and %x included.
func (k DHCHAPKey) Format(f fmt.State, _ rune) { io.WriteString(f, k.String()) }

// LogValue keeps the secret out of slog output.
func (k DHCHAPKey) LogValue() slog.Value { return slog.StringValue(k.String()) }
