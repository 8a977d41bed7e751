package nvmefmt_test

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// kunitHash returns the constructor of h for test-side computations.
func kunitHash(h nvmefmt.Hash) func() hash.Hash {
	switch h {
	case nvmefmt.SHA256:
		return sha256.New
	case nvmefmt.SHA384:
		return sha512.New384
	case nvmefmt.SHA512:
		return sha512.New
	}
	panic("no hash " + h.String())
}

// testBytes returns n reproducible pseudo-random bytes for seed.
func testBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6e766d65))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// keyBody builds a base64 key body by hand, with the CRC-32 of secret xor
// crcXor, so that tests can make keys this package refuses to encode.
func keyBody(secret []byte, crcXor uint32) string {
	raw := binary.LittleEndian.AppendUint32(append([]byte(nil), secret...), crc32.ChecksumIEEE(secret)^crcXor)
	return base64.StdEncoding.EncodeToString(raw)
}

// assertNoSecret fails if msg contains any 8-character run of the base64
// body, of the secret in hex (either case), or the CRC-32 in hex.
func assertNoSecret(t *testing.T, msg string, secret []byte, b64 string) {
	t.Helper()
	crc := make([]byte, 4)
	binary.LittleEndian.PutUint32(crc, crc32.ChecksumIEEE(secret))
	be := []byte{crc[3], crc[2], crc[1], crc[0]}
	needles := []string{b64, hex.EncodeToString(secret), hex.EncodeToString(crc), hex.EncodeToString(be)}
	for _, n := range needles {
		for _, s := range []string{n, strings.ToUpper(n)} {
			for i := 0; i+8 <= len(s); i++ {
				if strings.Contains(msg, s[i:i+8]) {
					t.Fatalf("message %q contains secret material %q", msg, s[i:i+8])
				}
			}
		}
	}
}
