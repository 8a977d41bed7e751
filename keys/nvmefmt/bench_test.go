package nvmefmt_test

import (
	"testing"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// Run with: go test -run '^$' -bench . -benchmem ./keys/nvmefmt/

var benchCiphers = []nvmefmt.Hash{nvmefmt.SHA256, nvmefmt.SHA384}

func BenchmarkEncodeDHCHAP(b *testing.B) {
	for _, h := range []nvmefmt.Hash{nvmefmt.SHA256, nvmefmt.SHA512} {
		secret := testBytes(1, h.Size())
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.EncodeDHCHAP(h, secret); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkParseDHCHAP(b *testing.B) {
	for _, h := range []nvmefmt.Hash{nvmefmt.SHA256, nvmefmt.SHA512} {
		s, _ := nvmefmt.EncodeDHCHAP(h, testBytes(1, h.Size()))
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.ParseDHCHAP(s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRetainedPSK(b *testing.B) {
	for _, h := range benchCiphers {
		configured := testBytes(2, h.Size())
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.RetainedPSK(h, configured, testHost); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkIdentityV1(b *testing.B) {
	for _, h := range benchCiphers {
		retained := testBytes(3, h.Size())
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.IdentityV1(h, retained, testHost, testSub); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkTLSPSK(b *testing.B) {
	for _, h := range benchCiphers {
		retained := testBytes(4, h.Size())
		digest, _ := nvmefmt.PSKDigest(h, retained, testHost, testSub)
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.TLSPSK(h, retained, digest); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDeriveTLS(b *testing.B) {
	for _, h := range benchCiphers {
		key := nvmefmt.TLSKey{Hash: h, PSK: testBytes(5, h.Size())}
		b.Run(h.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := nvmefmt.DeriveTLS(key, testHost, testSub); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
