package nvmefmt

import (
	"fmt"
	"io"
	"log/slog"
)

const (
	tlsPrefix = "NVMeTLSkey-1:"
	tlsKind   = "NVMeTLSkey-1 key"
)

// TLSKey is a configured NVMe/TCP TLS PSK as carried by the PSK interchange
// format, with the hash that turns it into a retained PSK (HashNone: used as
// is). fmt and slog print it redacted; only EncodeTLSPSK shows the PSK.
type TLSKey struct {
	Hash Hash
	PSK  []byte
}

// EncodeTLSPSK returns the PSK interchange format
// "NVMeTLSkey-1:<hh>:<base64(psk || CRC-32)>:". psk must be 32 bytes for
// SHA256, 48 for SHA384, and 32 or 48 for HashNone. nvme-cli 2.3's
// check-tls-key refuses hash 00 although the format allows it; emit 01 or 02
// for hosts of that vintage.
func EncodeTLSPSK(h Hash, psk []byte) (string, error) {
	if err := checkTLS(h, len(psk)); err != nil {
		return "", err
	}
	return encode(tlsPrefix, h, psk), nil
}

// Encode is EncodeTLSPSK(k.Hash, k.PSK).
func (k TLSKey) Encode() (string, error) { return EncodeTLSPSK(k.Hash, k.PSK) }

// ParseTLSPSK decodes a PSK interchange string strictly: the prefix (version
// 1 only), a hash identifier 00-02, canonical padded base64, a PSK length
// allowed for that hash (see EncodeTLSPSK), the CRC-32 and exactly one final
// ':'. Errors wrap ErrPrefix, ErrHash, ErrTrailer, ErrBase64, ErrLength or
// ErrCRC and never contain key material. An accepted string re-encodes
// identically.
func ParseTLSPSK(s string) (TLSKey, error) {
	h, raw, err := parse(s, tlsPrefix, tlsKind, SHA384)
	if err != nil {
		return TLSKey{}, err
	}
	if err := checkTLS(h, len(raw)-crcLen); err != nil {
		clear(raw)
		return TLSKey{}, err
	}
	psk, err := checkCRC(raw, tlsKind)
	if err != nil {
		clear(raw)
		return TLSKey{}, err
	}
	return TLSKey{Hash: h, PSK: psk}, nil
}

// Cipher returns the hash of the TLS cipher suite the key serves, which
// names the PSK identity and drives the TLS PSK derivation: the key's own
// hash for 01 and 02; for 00, SHA256 for a 32-byte PSK and SHA384 for a
// 48-byte one (TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384), as libnvme
// and SPDK choose.
func (k TLSKey) Cipher() (Hash, error) {
	if err := checkTLS(k.Hash, len(k.PSK)); err != nil {
		return 0, err
	}
	if k.Hash != HashNone {
		return k.Hash, nil
	}
	if len(k.PSK) == SHA384.Size() {
		return SHA384, nil
	}
	return SHA256, nil
}

// checkTLS enforces the interchange lengths: 32 or 48 bytes for 00, the hash
// size for 01 and 02; 03 (SHA-512) has no TLS 1.3 cipher suite.
func checkTLS(h Hash, n int) error {
	switch h {
	case HashNone:
		if n != 32 && n != 48 {
			return fmt.Errorf("%w: %s PSK of %d bytes; hash none takes 32 or 48", ErrLength, tlsKind, n)
		}
	case SHA256, SHA384:
		if n != h.Size() {
			return fmt.Errorf("%w: %s PSK of %d bytes; hash %s takes %d", ErrLength, tlsKind, n, h, h.Size())
		}
	default:
		return fmt.Errorf("%w: %s with hash %s; want none, sha256 or sha384", ErrHash, tlsKind, h)
	}
	return nil
}

// String describes the key without its PSK.
func (k TLSKey) String() string { return redacted("nvmefmt.TLSKey", k.Hash, len(k.PSK)) }

// Format prints the key redacted for every verb, %#v and %x included.
func (k TLSKey) Format(f fmt.State, _ rune) { io.WriteString(f, k.String()) }

// LogValue keeps the PSK out of slog output.
func (k TLSKey) LogValue() slog.Value { return slog.StringValue(k.String()) }
