package nvmefmt_test

import (
	"bytes"
	"crypto/hkdf"
	"crypto/hmac"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

var allHashes = []nvmefmt.Hash{nvmefmt.HashNone, nvmefmt.SHA256, nvmefmt.SHA384, nvmefmt.SHA512}

// dhchapLengths and tlsLengths are the secret lengths each format allows per
// hash (the strict rules of EncodeDHCHAP and EncodeTLSPSK).
var (
	dhchapLengths = map[nvmefmt.Hash][]int{
		nvmefmt.HashNone: {32, 48, 64}, nvmefmt.SHA256: {32}, nvmefmt.SHA384: {48}, nvmefmt.SHA512: {64},
	}
	tlsLengths = map[nvmefmt.Hash][]int{
		nvmefmt.HashNone: {32, 48}, nvmefmt.SHA256: {32}, nvmefmt.SHA384: {48},
	}
)

const (
	testHost = "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
	testSub  = "nqn.2019-10.dev.nvmegate:tenant-a:ns-1"
)

func TestHash(t *testing.T) {
	for _, tc := range []struct {
		h          nvmefmt.Hash
		name, hmac string
		size       int
	}{
		{nvmefmt.HashNone, "none", "", 0},
		{nvmefmt.SHA256, "sha256", "hmac(sha256)", 32},
		{nvmefmt.SHA384, "sha384", "hmac(sha384)", 48},
		{nvmefmt.SHA512, "sha512", "hmac(sha512)", 64},
		{nvmefmt.Hash(4), "Hash(4)", "", 0},
	} {
		if tc.h.String() != tc.name || tc.h.HMACName() != tc.hmac || tc.h.Size() != tc.size {
			t.Errorf("Hash(%d): %q %q %d; want %q %q %d", tc.h, tc.h, tc.h.HMACName(), tc.h.Size(), tc.name, tc.hmac, tc.size)
		}
		got, err := nvmefmt.ParseHash(tc.name)
		if tc.h <= nvmefmt.SHA512 && (err != nil || got != tc.h) {
			t.Errorf("ParseHash(%q) = %v, %v", tc.name, got, err)
		}
	}
	for _, bad := range []string{"", "SHA256", "sha-256", "hmac(sha256)", "01", "Hash(4)"} {
		if _, err := nvmefmt.ParseHash(bad); !errors.Is(err, nvmefmt.ErrHash) {
			t.Errorf("ParseHash(%q) error = %v, want ErrHash", bad, err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	seed := uint64(0)
	for _, h := range allHashes {
		for _, n := range dhchapLengths[h] {
			for range 20 {
				seed++
				secret := testBytes(seed, n)
				s, err := nvmefmt.EncodeDHCHAP(h, secret)
				if err != nil {
					t.Fatalf("EncodeDHCHAP(%s, %d bytes): %v", h, n, err)
				}
				if want := 7 + 3 + (n+4+2)/3*4 + 1; len(s) != want || !strings.HasPrefix(s, "DHHC-1:0") {
					t.Fatalf("EncodeDHCHAP(%s, %d bytes) has %d characters, want %d", h, n, len(s), want)
				}
				k, err := nvmefmt.ParseDHCHAP(s)
				if err != nil || k.Hash != h || !bytes.Equal(k.Secret, secret) {
					t.Fatalf("ParseDHCHAP(EncodeDHCHAP(%s, %d bytes)) = %v, %v", h, n, k, err)
				}
			}
		}
		for _, n := range tlsLengths[h] {
			for range 20 {
				seed++
				psk := testBytes(seed, n)
				s, err := nvmefmt.EncodeTLSPSK(h, psk)
				if err != nil {
					t.Fatalf("EncodeTLSPSK(%s, %d bytes): %v", h, n, err)
				}
				k, err := nvmefmt.ParseTLSPSK(s)
				if err != nil || k.Hash != h || !bytes.Equal(k.PSK, psk) {
					t.Fatalf("ParseTLSPSK(EncodeTLSPSK(%s, %d bytes)) = %v, %v", h, n, k, err)
				}
			}
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, h := range append(allHashes, 4, 0xff) {
		for _, n := range []int{0, 1, 16, 31, 32, 33, 36, 47, 48, 52, 63, 64, 65, 68, 128} {
			secret := make([]byte, n)
			_, err := nvmefmt.EncodeDHCHAP(h, secret)
			if ok := containsInt(dhchapLengths[h], n); ok != (err == nil) {
				t.Errorf("EncodeDHCHAP(%s, %d bytes) error = %v", h, n, err)
			} else if err != nil && !errors.Is(err, nvmefmt.ErrLength) && !errors.Is(err, nvmefmt.ErrHash) {
				t.Errorf("EncodeDHCHAP(%s, %d bytes) error = %v, want ErrLength or ErrHash", h, n, err)
			}
			_, err = nvmefmt.EncodeTLSPSK(h, secret)
			if ok := containsInt(tlsLengths[h], n); ok != (err == nil) {
				t.Errorf("EncodeTLSPSK(%s, %d bytes) error = %v", h, n, err)
			} else if err != nil && !errors.Is(err, nvmefmt.ErrLength) && !errors.Is(err, nvmefmt.ErrHash) {
				t.Errorf("EncodeTLSPSK(%s, %d bytes) error = %v, want ErrLength or ErrHash", h, n, err)
			}
		}
	}
	if _, err := nvmefmt.EncodeTLSPSK(nvmefmt.SHA512, make([]byte, 64)); !errors.Is(err, nvmefmt.ErrHash) {
		t.Errorf("EncodeTLSPSK(sha512) error = %v, want ErrHash", err)
	}
	if _, err := nvmefmt.EncodeDHCHAP(nvmefmt.Hash(4), make([]byte, 32)); !errors.Is(err, nvmefmt.ErrHash) {
		t.Errorf("EncodeDHCHAP(Hash(4)) error = %v, want ErrHash", err)
	}
	if _, err := nvmefmt.EncodeDHCHAP(nvmefmt.SHA256, nil); !errors.Is(err, nvmefmt.ErrLength) {
		t.Errorf("EncodeDHCHAP(sha256, nil) error = %v, want ErrLength", err)
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// malformed is one malformed key string, the error it must produce, and the
// secret it was built from (to check the message does not show it).
type malformed struct {
	name   string
	s      string
	want   error
	secret []byte
}

// malformedKeys returns a malformed string of every kind for a format.
func malformedKeys(prefix string, maxHash nvmefmt.Hash) []malformed {
	s32, s48 := testBytes(101, 32), testBytes(102, 48)
	b32, b48 := keyBody(s32, 0), keyBody(s48, 0)
	ok01 := prefix + "01:" + b32 + ":"
	ok02 := prefix + "02:" + b48 + ":"
	other := "NVMeTLSkey-1:"
	if prefix == other {
		other = "DHHC-1:"
	}
	flip := func(s string, i int) string { // change one base64 character
		c := byte('A')
		if s[i] == 'A' {
			c = 'B'
		}
		return s[:i] + string(c) + s[i+1:]
	}
	badPad := b48[:len(b48)-3] + string(rune(b48[len(b48)-3]+1)) + "==" // non-zero padding bits
	if b48[len(b48)-3] == 'z' || b48[len(b48)-3] == '9' || b48[len(b48)-3] == '/' || b48[len(b48)-3] == 'Z' {
		badPad = b48[:len(b48)-3] + "B=="
	}
	return []malformed{
		{"empty", "", nvmefmt.ErrPrefix, nil},
		{"other format", other + "01:" + b32 + ":", nvmefmt.ErrPrefix, s32},
		{"lower-case prefix", strings.ToLower(prefix) + "01:" + b32 + ":", nvmefmt.ErrPrefix, s32},
		{"next version", strings.Replace(prefix, "-1:", "-2:", 1) + "01:" + b32 + ":", nvmefmt.ErrPrefix, s32},
		{"leading space", " " + ok01, nvmefmt.ErrPrefix, s32},
		{"prefix only", prefix, nvmefmt.ErrHash, nil},
		{"one-digit hash", prefix + "1:" + b32 + ":", nvmefmt.ErrHash, s32},
		{"three-digit hash", prefix + "001:" + b32 + ":", nvmefmt.ErrHash, s32},
		{"hex hash", prefix + "0a:" + b32 + ":", nvmefmt.ErrHash, s32},
		{"hash above range", prefix + fmt.Sprintf("%02d:", maxHash+1) + b48 + ":", nvmefmt.ErrHash, s48},
		{"hash 10", prefix + "10:" + b32 + ":", nvmefmt.ErrHash, s32},
		{"no trailing colon", ok01[:len(ok01)-1], nvmefmt.ErrTrailer, s32},
		{"trailing newline", ok01 + "\n", nvmefmt.ErrTrailer, s32},
		{"trailing space", ok01 + " ", nvmefmt.ErrTrailer, s32},
		{"two colons", ok01 + ":", nvmefmt.ErrTrailer, s32},
		{"extra field", ok01 + "x:", nvmefmt.ErrTrailer, s32},
		{"colon inside body", prefix + "01:" + b32[:20] + ":" + b32[20:] + ":", nvmefmt.ErrTrailer, s32},
		{"bad character", prefix + "01:" + b32[:10] + "*" + b32[11:] + ":", nvmefmt.ErrBase64, s32},
		{"url alphabet", prefix + "01:" + strings.NewReplacer("+", "-", "/", "_").Replace(b32) + "-:", nvmefmt.ErrBase64, s32},
		{"line break", prefix + "01:" + b32[:24] + "\n" + b32[24:] + ":", nvmefmt.ErrBase64, s32},
		{"carriage return", prefix + "01:" + b32[:24] + "\r" + b32[24:] + ":", nvmefmt.ErrBase64, s32},
		{"missing padding", prefix + "02:" + strings.TrimRight(b48, "=") + ":", nvmefmt.ErrBase64, s48},
		{"non-zero padding bits", prefix + "02:" + badPad + ":", nvmefmt.ErrBase64, s48},
		{"truncated body", prefix + "01:" + b32[:len(b32)-1] + ":", nvmefmt.ErrBase64, s32},
		{"empty body", prefix + "00::", nvmefmt.ErrLength, nil},
		{"body shorter than a CRC", prefix + "00:AAAA:", nvmefmt.ErrLength, nil},
		{"body four characters short", prefix + "01:" + b32[:len(b32)-4] + ":", nvmefmt.ErrLength, s32},
		{"secret of 40 bytes", prefix + "00:" + keyBody(testBytes(103, 40), 0) + ":", nvmefmt.ErrLength, testBytes(103, 40)},
		{"hash 01 with 48 bytes", prefix + "01:" + b48 + ":", nvmefmt.ErrLength, s48},
		{"body longer than any key", prefix + "00:" + strings.Repeat(b48, 30) + ":", nvmefmt.ErrLength, s48},
		{"hash 02 with 32 bytes", prefix + "02:" + b32 + ":", nvmefmt.ErrLength, s32},
		{"CRC off by one bit", prefix + "01:" + keyBody(s32, 1) + ":", nvmefmt.ErrCRC, s32},
		{"CRC big-endian", prefix + "01:" + bigEndianCRCBody(s32) + ":", nvmefmt.ErrCRC, s32},
		{"secret edited", flip(ok01, len(prefix)+3+5), nvmefmt.ErrCRC, s32},
		{"valid control 01", ok01, nil, s32},
		{"valid control 02", ok02, nil, s48},
	}
}

// bigEndianCRCBody appends the CRC-32 big-endian, the byte order the
// formats do not use.
func bigEndianCRCBody(secret []byte) string {
	raw := binary.BigEndian.AppendUint32(append([]byte(nil), secret...), crc32.ChecksumIEEE(secret))
	return base64.StdEncoding.EncodeToString(raw)
}

func TestParseDHCHAPMalformed(t *testing.T) {
	cases := malformedKeys("DHHC-1:", nvmefmt.SHA512)
	s64 := testBytes(104, 64)
	cases = append(cases,
		malformed{"hash 03 with 32 bytes", "DHHC-1:03:" + keyBody(testBytes(101, 32), 0) + ":", nvmefmt.ErrLength, testBytes(101, 32)},
		malformed{"hash 00 with 64 bytes", "DHHC-1:00:" + keyBody(s64, 0) + ":", nil, s64},
		malformed{"hash 00 with 80 bytes", "DHHC-1:00:" + keyBody(testBytes(105, 80), 0) + ":", nvmefmt.ErrLength, testBytes(105, 80)},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, err := nvmefmt.ParseDHCHAP(tc.s)
			checkMalformed(t, tc, err)
			if err != nil && (k.Secret != nil || k.Hash != 0) {
				t.Errorf("ParseDHCHAP failed but returned %v", k)
			}
		})
	}
}

func TestParseTLSPSKMalformed(t *testing.T) {
	cases := malformedKeys("NVMeTLSkey-1:", nvmefmt.SHA384)
	s64 := testBytes(104, 64)
	cases = append(cases,
		malformed{"hash 03", "NVMeTLSkey-1:03:" + keyBody(s64, 0) + ":", nvmefmt.ErrHash, s64},
		malformed{"hash 00 with 64 bytes", "NVMeTLSkey-1:00:" + keyBody(s64, 0) + ":", nvmefmt.ErrLength, s64},
		malformed{"hash 00 with 48 bytes", "NVMeTLSkey-1:00:" + keyBody(testBytes(102, 48), 0) + ":", nil, testBytes(102, 48)},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, err := nvmefmt.ParseTLSPSK(tc.s)
			checkMalformed(t, tc, err)
			if err != nil && (k.PSK != nil || k.Hash != 0) {
				t.Errorf("ParseTLSPSK failed but returned %v", k)
			}
		})
	}
}

func checkMalformed(t *testing.T, tc malformed, err error) {
	t.Helper()
	if tc.want == nil {
		if err != nil {
			t.Fatalf("error = %v, want none", err)
		}
		return
	}
	if !errors.Is(err, tc.want) {
		t.Fatalf("error = %v, want %v", err, tc.want)
	}
	for _, other := range []error{nvmefmt.ErrPrefix, nvmefmt.ErrHash, nvmefmt.ErrBase64, nvmefmt.ErrLength, nvmefmt.ErrCRC, nvmefmt.ErrTrailer} {
		if other != tc.want && errors.Is(err, other) {
			t.Fatalf("error = %v wraps %v as well as %v", err, other, tc.want)
		}
	}
	// The message must not show the body or the secret.
	b := ""
	if i := strings.IndexByte(tc.s, ':'); i >= 0 && len(tc.s) > i+4 {
		b = tc.s[i+4:]
	}
	assertNoSecret(t, err.Error(), tc.secret, b)
}

func TestTransformDHCHAP(t *testing.T) {
	for _, h := range allHashes {
		for _, n := range dhchapLengths[h] {
			secret := testBytes(uint64(n)+uint64(h)*100, n)
			got, err := nvmefmt.TransformDHCHAP(nvmefmt.DHCHAPKey{Hash: h, Secret: secret}, testHost)
			if err != nil {
				t.Fatalf("TransformDHCHAP(%s, %d bytes): %v", h, n, err)
			}
			if h == nvmefmt.HashNone {
				if !bytes.Equal(got, secret) || &got[0] == &secret[0] {
					t.Fatalf("hash none must return a copy of the secret")
				}
				continue
			}
			m := hmac.New(kunitHash(h), secret)
			m.Write([]byte(testHost + "NVMe-over-Fabrics"))
			if !bytes.Equal(got, m.Sum(nil)) || len(got) != h.Size() {
				t.Fatalf("TransformDHCHAP(%s) = %x, want HMAC(secret, nqn || \"NVMe-over-Fabrics\")", h, got)
			}
		}
	}
	key := nvmefmt.DHCHAPKey{Hash: nvmefmt.SHA256, Secret: testBytes(1, 32)}
	for _, bad := range []string{"", "nqn.with space", "nqn.tab\t", "nqn.nul\x00", "nqn.del\x7f", strings.Repeat("n", 224)} {
		if _, err := nvmefmt.TransformDHCHAP(key, bad); !errors.Is(err, nvmefmt.ErrNQN) {
			t.Errorf("TransformDHCHAP(nqn %q) error = %v, want ErrNQN", bad, err)
		}
	}
	for _, bad := range []nvmefmt.DHCHAPKey{{Hash: nvmefmt.SHA256, Secret: testBytes(1, 48)}, {Hash: 4, Secret: testBytes(1, 32)}, {}} {
		if _, err := nvmefmt.TransformDHCHAP(bad, testHost); err == nil {
			t.Errorf("TransformDHCHAP(%v) succeeded", bad)
		}
	}
}

func TestTLSKeyCipher(t *testing.T) {
	for _, tc := range []struct {
		k    nvmefmt.TLSKey
		want nvmefmt.Hash
	}{
		{nvmefmt.TLSKey{Hash: nvmefmt.HashNone, PSK: make([]byte, 32)}, nvmefmt.SHA256},
		{nvmefmt.TLSKey{Hash: nvmefmt.HashNone, PSK: make([]byte, 48)}, nvmefmt.SHA384},
		{nvmefmt.TLSKey{Hash: nvmefmt.SHA256, PSK: make([]byte, 32)}, nvmefmt.SHA256},
		{nvmefmt.TLSKey{Hash: nvmefmt.SHA384, PSK: make([]byte, 48)}, nvmefmt.SHA384},
	} {
		if got, err := tc.k.Cipher(); err != nil || got != tc.want {
			t.Errorf("%v.Cipher() = %v, %v; want %v", tc.k, got, err, tc.want)
		}
	}
	for _, k := range []nvmefmt.TLSKey{{}, {Hash: nvmefmt.SHA256, PSK: make([]byte, 48)}, {Hash: nvmefmt.SHA512, PSK: make([]byte, 64)}} {
		if _, err := k.Cipher(); err == nil {
			t.Errorf("%v.Cipher() succeeded", k)
		}
	}
}

// TestDeriveTLS checks that DeriveTLS agrees with the primitives for every
// kind of interchange key, that hash 00 uses the configured PSK as retained
// PSK, and the v0 TLS PSK against an independent HKDF computation.
func TestDeriveTLS(t *testing.T) {
	for _, h := range []nvmefmt.Hash{nvmefmt.HashNone, nvmefmt.SHA256, nvmefmt.SHA384} {
		for _, n := range tlsLengths[h] {
			for _, compat := range []bool{false, true} {
				var opts []nvmefmt.Option
				if compat {
					opts = []nvmefmt.Option{nvmefmt.CompatLabels()}
				}
				key := nvmefmt.TLSKey{Hash: h, PSK: testBytes(uint64(n), n)}
				c, err := nvmefmt.DeriveTLS(key, testHost, testSub, opts...)
				if err != nil {
					t.Fatalf("DeriveTLS(%s/%d): %v", h, n, err)
				}
				cipher, _ := key.Cipher()
				retained, err := nvmefmt.RetainedPSK(h, key.PSK, testHost, opts...)
				if err != nil {
					t.Fatal(err)
				}
				if h == nvmefmt.HashNone && !bytes.Equal(retained, key.PSK) {
					t.Fatalf("hash none: retained PSK must be the configured PSK")
				}
				if h != nvmefmt.HashNone && bytes.Equal(retained, key.PSK) {
					t.Fatalf("hash %s: retained PSK equals the configured PSK", h)
				}
				id0, _ := nvmefmt.IdentityV0(cipher, testHost, testSub)
				id1, _ := nvmefmt.IdentityV1(cipher, retained, testHost, testSub)
				digest, _ := nvmefmt.PSKDigest(cipher, retained, testHost, testSub)
				psk1, _ := nvmefmt.TLSPSK(cipher, retained, digest, opts...)
				psk0, _ := nvmefmt.TLSPSKV0(cipher, retained, testHost, testSub, opts...)
				if c.Cipher != cipher || c.IdentityV0 != id0 || c.IdentityV1 != id1 ||
					!bytes.Equal(c.PSKV1, psk1) || !bytes.Equal(c.PSKV0, psk0) {
					t.Fatalf("DeriveTLS(%s/%d) disagrees with the primitives", h, n)
				}
				wantID := fmt.Sprintf("NVMe1R%02d %s %s %s", cipher, testHost, testSub, digest)
				if id1 != wantID || id0 != fmt.Sprintf("NVMe0R%02d %s %s", cipher, testHost, testSub) {
					t.Fatalf("identities %q, %q", id0, id1)
				}
				if len(psk1) != cipher.Size() || len(psk0) != cipher.Size() || bytes.Equal(psk0, psk1) {
					t.Fatalf("TLS PSKs have the wrong size or coincide")
				}
				if !compat {
					if want := independentExpandLabel(t, cipher, retained, "nvme-tls-psk", id0); !bytes.Equal(psk0, want) {
						t.Fatalf("TLSPSKV0 = %x, want %x", psk0, want)
					}
				}
			}
		}
	}
}

// independentExpandLabel computes HKDF-Expand-Label per RFC 8446 without the
// package's code, for derivations with no published vector.
func independentExpandLabel(t *testing.T, h nvmefmt.Hash, secret []byte, label, context string) []byte {
	t.Helper()
	var info bytes.Buffer
	binary.Write(&info, binary.BigEndian, uint16(h.Size()))
	info.WriteByte(byte(len("tls13 " + label)))
	info.WriteString("tls13 " + label)
	info.WriteByte(byte(len(context)))
	info.WriteString(context)
	out, err := hkdf.Key(kunitHash(h), secret, nil, info.String(), h.Size())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestDerivationErrors(t *testing.T) {
	r32, r48 := testBytes(7, 32), testBytes(8, 48)
	digest, err := nvmefmt.PSKDigest(nvmefmt.SHA256, r32, testHost, testSub)
	if err != nil {
		t.Fatal(err)
	}
	long := "nqn." + strings.Repeat("x", 220)
	nearMax := "nqn." + strings.Repeat("y", 215) // a v0 identity of 267 bytes
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"retained: bad hash", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.SHA512, testBytes(1, 64), testHost); return err }, nvmefmt.ErrHash},
		{"retained: unknown hash", func() error { _, err := nvmefmt.RetainedPSK(9, r32, testHost); return err }, nvmefmt.ErrHash},
		{"retained: wrong length", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.SHA256, r48, testHost); return err }, nvmefmt.ErrLength},
		{"retained: none with 64", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.HashNone, testBytes(1, 64), testHost); return err }, nvmefmt.ErrLength},
		{"retained: nil", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.SHA256, nil, testHost); return err }, nvmefmt.ErrLength},
		{"retained: empty host", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.SHA256, r32, ""); return err }, nvmefmt.ErrNQN},
		{"retained: long host", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.SHA256, r32, long); return err }, nvmefmt.ErrNQN},
		{"retained: none still checks host", func() error { _, err := nvmefmt.RetainedPSK(nvmefmt.HashNone, r32, "a b"); return err }, nvmefmt.ErrNQN},
		{"digest: none", func() error { _, err := nvmefmt.PSKDigest(nvmefmt.HashNone, r32, testHost, testSub); return err }, nvmefmt.ErrHash},
		{"digest: sha512", func() error {
			_, err := nvmefmt.PSKDigest(nvmefmt.SHA512, testBytes(1, 64), testHost, testSub)
			return err
		}, nvmefmt.ErrHash},
		{"digest: wrong length", func() error { _, err := nvmefmt.PSKDigest(nvmefmt.SHA384, r32, testHost, testSub); return err }, nvmefmt.ErrLength},
		{"digest: space in sub", func() error { _, err := nvmefmt.PSKDigest(nvmefmt.SHA256, r32, testHost, "nqn.a b"); return err }, nvmefmt.ErrNQN},
		{"digest: empty sub", func() error { _, err := nvmefmt.PSKDigest(nvmefmt.SHA256, r32, testHost, ""); return err }, nvmefmt.ErrNQN},
		{"v0: none", func() error { _, err := nvmefmt.IdentityV0(nvmefmt.HashNone, testHost, testSub); return err }, nvmefmt.ErrHash},
		{"v0: empty host", func() error { _, err := nvmefmt.IdentityV0(nvmefmt.SHA256, "", testSub); return err }, nvmefmt.ErrNQN},
		{"v0: newline", func() error { _, err := nvmefmt.IdentityV0(nvmefmt.SHA256, testHost, "nqn.x\n"); return err }, nvmefmt.ErrNQN},
		{"v1: nil retained", func() error { _, err := nvmefmt.IdentityV1(nvmefmt.SHA256, nil, testHost, testSub); return err }, nvmefmt.ErrLength},
		{"v1: sha512", func() error {
			_, err := nvmefmt.IdentityV1(nvmefmt.SHA512, testBytes(1, 64), testHost, testSub)
			return err
		}, nvmefmt.ErrHash},
		{"tls psk: wrong length", func() error { _, err := nvmefmt.TLSPSK(nvmefmt.SHA256, r48, digest); return err }, nvmefmt.ErrLength},
		{"tls psk: none", func() error { _, err := nvmefmt.TLSPSK(nvmefmt.HashNone, r32, digest); return err }, nvmefmt.ErrHash},
		{"tls psk: empty digest", func() error { _, err := nvmefmt.TLSPSK(nvmefmt.SHA256, r32, ""); return err }, nvmefmt.ErrDigest},
		{"tls psk: sha384 digest for sha256", func() error {
			d, _ := nvmefmt.PSKDigest(nvmefmt.SHA384, r48, testHost, testSub)
			_, err := nvmefmt.TLSPSK(nvmefmt.SHA256, r32, d)
			return err
		}, nvmefmt.ErrDigest},
		{"tls psk: digest with space", func() error { _, err := nvmefmt.TLSPSK(nvmefmt.SHA256, r32, digest[:43]+" "); return err }, nvmefmt.ErrDigest},
		{"tls psk: digest padding bits", func() error { _, err := nvmefmt.TLSPSK(nvmefmt.SHA256, r32, digest[:42]+"/="); return err }, nvmefmt.ErrDigest},
		{"tls psk v0: wrong length", func() error { _, err := nvmefmt.TLSPSKV0(nvmefmt.SHA384, r32, testHost, testSub); return err }, nvmefmt.ErrLength},
		{"tls psk v0: identity over 255 bytes", func() error { _, err := nvmefmt.TLSPSKV0(nvmefmt.SHA256, r32, nearMax, testSub); return err }, nvmefmt.ErrNQN},
		{"derive: identity over 255 bytes", func() error {
			_, err := nvmefmt.DeriveTLS(nvmefmt.TLSKey{Hash: nvmefmt.SHA256, PSK: r32}, nearMax, testSub)
			return err
		}, nvmefmt.ErrNQN},
		{"derive: bad key", func() error { _, err := nvmefmt.DeriveTLS(nvmefmt.TLSKey{}, testHost, testSub); return err }, nvmefmt.ErrLength},
		{"derive: empty sub", func() error {
			_, err := nvmefmt.DeriveTLS(nvmefmt.TLSKey{Hash: nvmefmt.SHA256, PSK: r32}, testHost, "")
			return err
		}, nvmefmt.ErrNQN},
	} {
		err := tc.call()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error = %v, want %v", tc.name, err, tc.want)
			continue
		}
		assertNoSecret(t, err.Error(), r32, base64.StdEncoding.EncodeToString(r32))
		assertNoSecret(t, err.Error(), r48, base64.StdEncoding.EncodeToString(r48))
	}

	// The limits themselves are allowed: a 223-byte NQN, non-ASCII UTF-8,
	// and a v0 identity of exactly 255 bytes.
	max := "nqn." + strings.Repeat("z", 219)
	if _, err := nvmefmt.RetainedPSK(nvmefmt.SHA256, r32, max); err != nil {
		t.Errorf("223-byte host NQN: %v", err)
	}
	if _, err := nvmefmt.IdentityV1(nvmefmt.SHA256, r32, "nqn.2014-08.org.exämple:host", testSub); err != nil {
		t.Errorf("UTF-8 NQN: %v", err)
	}
	host255 := "nqn." + strings.Repeat("h", 255-9-1-len(testSub)-4)
	if id, _ := nvmefmt.IdentityV0(nvmefmt.SHA256, host255, testSub); len(id) != 255 {
		t.Fatalf("test bug: identity has %d bytes", len(id))
	}
	if _, err := nvmefmt.TLSPSKV0(nvmefmt.SHA256, r32, host255, testSub); err != nil {
		t.Errorf("255-byte v0 identity: %v", err)
	}
}

// TestRedacted checks that keys and credentials never print their secrets,
// whatever the fmt verb, and that slog shows them redacted.
func TestRedacted(t *testing.T) {
	secret := testBytes(42, 48)
	b64 := base64.StdEncoding.EncodeToString(secret)
	dk := nvmefmt.DHCHAPKey{Hash: nvmefmt.SHA384, Secret: secret}
	tk := nvmefmt.TLSKey{Hash: nvmefmt.SHA384, PSK: secret}
	creds, err := nvmefmt.DeriveTLS(tk, testHost, testSub)
	if err != nil {
		t.Fatal(err)
	}
	values := []any{dk, &dk, tk, &tk, creds, &creds, []nvmefmt.DHCHAPKey{dk}, struct{ K nvmefmt.TLSKey }{tk}}
	for _, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%d", "%q"} {
			out := fmt.Sprintf(verb, v)
			assertNoSecret(t, out, secret, b64)
			assertNoSecret(t, out, creds.PSKV0, base64.StdEncoding.EncodeToString(creds.PSKV0))
			assertNoSecret(t, out, creds.PSKV1, base64.StdEncoding.EncodeToString(creds.PSKV1))
			if !strings.Contains(out, "redacted") {
				t.Errorf("Sprintf(%s, %T) = %q, want a redacted description", verb, v, out)
			}
		}
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("keys", "dhchap", dk, "tls", tk, "creds", creds)
	assertNoSecret(t, buf.String(), secret, b64)
	if !strings.Contains(creds.String(), creds.IdentityV1) {
		t.Errorf("TLSCredentials.String() should show the identities")
	}
}
