package nvmefmt

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
)

// Both key formats are "<prefix><hh>:<base64(secret || CRC-32)>:", where hh
// is two decimal digits, the CRC-32 is the IEEE (zlib) one of the secret,
// appended little-endian, and base64 is the standard alphabet with padding.

const (
	crcLen = 4
	// maxSecret is the largest secret of either format (DH-HMAC-CHAP
	// SHA-512); encoding buffers are sized for it.
	maxSecret = 64
	// maxBody is the base64 length of maxSecret plus its CRC.
	maxBody = (maxSecret + crcLen + 2) / 3 * 4
)

// strictBase64 rejects non-zero padding bits, so that a parsed key re-encodes
// to the identical string. It still skips CR and LF, which parse refuses
// before decoding.
var strictBase64 = base64.StdEncoding.Strict()

// encode returns the interchange string of secret, which the caller has
// validated (at most maxSecret bytes). It makes one allocation: the string.
func encode(prefix string, h Hash, secret []byte) string {
	var raw [maxSecret + crcLen]byte
	n := copy(raw[:], secret)
	binary.LittleEndian.PutUint32(raw[n:], crc32.ChecksumIEEE(secret))
	var body [maxBody]byte
	m := base64.StdEncoding.EncodedLen(n + crcLen)
	base64.StdEncoding.Encode(body[:m], raw[:n+crcLen])
	clear(raw[:])

	var b strings.Builder
	b.Grow(len(prefix) + 3 + m + 1)
	b.WriteString(prefix)
	b.WriteByte('0')
	b.WriteByte('0' + byte(h))
	b.WriteByte(':')
	b.Write(body[:m])
	b.WriteByte(':')
	clear(body[:])
	return b.String()
}

// parse splits and decodes an interchange string: prefix, then a hash
// identifier 00..maxHash, then the base64 body and the final ':'. It returns
// the hash and the decoded body (secret and CRC, not yet checked). kind names
// the format in errors. No error includes any part of s.
func parse(s, prefix, kind string, maxHash Hash) (Hash, []byte, error) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return 0, nil, fmt.Errorf("%w: %s must start with %q", ErrPrefix, kind, prefix)
	}
	if len(rest) < 3 || rest[2] != ':' {
		return 0, nil, fmt.Errorf("%w: %s needs two digits and ':' after %q", ErrHash, kind, prefix)
	}
	if rest[0] != '0' || rest[1] < '0' || rest[1] > '0'+byte(maxHash) {
		return 0, nil, fmt.Errorf("%w: %s hash identifier must be 00 to 0%d", ErrHash, kind, maxHash)
	}
	h := Hash(rest[1] - '0')

	body := rest[3:]
	end := strings.IndexByte(body, ':')
	if end < 0 {
		return 0, nil, fmt.Errorf("%w: %s lacks the ':' after its base64 body", ErrTrailer, kind)
	}
	if end != len(body)-1 {
		return 0, nil, fmt.Errorf("%w: %s has %d unexpected byte(s) after the ':' that ends its base64 body",
			ErrTrailer, kind, len(body)-end-1)
	}
	body = body[:end]
	for i := 0; i < len(body); i++ {
		if !isBase64Char(body[i]) {
			return 0, nil, fmt.Errorf("%w: %s has an invalid character at body offset %d", ErrBase64, kind, i)
		}
	}
	if len(body) > maxBody {
		// Longer than any key; do not decode it.
		return 0, nil, fmt.Errorf("%w: %s body of %d characters is longer than any secret's", ErrLength, kind, len(body))
	}
	raw, err := strictBase64.DecodeString(body)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s body of %d characters is not canonical padded base64", ErrBase64, kind, len(body))
	}
	if len(raw) <= crcLen {
		return 0, nil, fmt.Errorf("%w: %s body decodes to %d bytes, no room for a secret and its CRC-32",
			ErrLength, kind, len(raw))
	}
	return h, raw, nil
}

// checkCRC checks the CRC-32 in the last four bytes of raw and returns the
// secret before it.
func checkCRC(raw []byte, kind string) ([]byte, error) {
	n := len(raw) - crcLen
	if n < 0 || binary.LittleEndian.Uint32(raw[n:]) != crc32.ChecksumIEEE(raw[:n]) {
		return nil, fmt.Errorf("%w: %s checksum does not match its secret", ErrCRC, kind)
	}
	return raw[:n:n], nil
}

func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' ||
		c == '+' || c == '/' || c == '='
}

// redacted describes a secret for fmt and slog without showing it.
func redacted(typ string, h Hash, n int) string {
	return fmt.Sprintf("%s{Hash: %s, %d-byte secret redacted}", typ, h, n)
}
