package nvmefmt_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// The fuzz targets check that the parsers never panic, that every error wraps
// exactly one parse sentinel, and that an accepted string re-encodes to
// itself (so there is one string per key, and what we store is what we read).
// `go test` runs the seeds below and the corpus in testdata/fuzz; `go test
// -fuzz FuzzParseDHCHAP` explores further.

var parseSentinels = []error{
	nvmefmt.ErrPrefix, nvmefmt.ErrHash, nvmefmt.ErrBase64,
	nvmefmt.ErrLength, nvmefmt.ErrCRC, nvmefmt.ErrTrailer,
}

func checkParseError(t *testing.T, err error) {
	t.Helper()
	n := 0
	for _, s := range parseSentinels {
		if errors.Is(err, s) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("error %v wraps %d parse sentinels, want 1", err, n)
	}
}

func FuzzParseDHCHAP(f *testing.F) {
	seed := uint64(500)
	for _, h := range allHashes {
		for _, n := range dhchapLengths[h] {
			seed++
			s, _ := nvmefmt.EncodeDHCHAP(h, testBytes(seed, n))
			f.Add(s)
		}
	}
	for _, tc := range malformedKeys("DHHC-1:", nvmefmt.SHA512) {
		f.Add(tc.s)
	}
	f.Add("DHHC-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := nvmefmt.ParseDHCHAP(s)
		if err != nil {
			checkParseError(t, err)
			return
		}
		again, err := nvmefmt.EncodeDHCHAP(k.Hash, k.Secret)
		if err != nil || again != s {
			t.Fatalf("ParseDHCHAP accepted %q, which re-encodes to %q, %v", s, again, err)
		}
		if _, err := nvmefmt.TransformDHCHAP(k, "nqn.fuzz"); err != nil {
			t.Fatalf("TransformDHCHAP of a parsed key: %v", err)
		}
	})
}

func FuzzParseTLSPSK(f *testing.F) {
	seed := uint64(600)
	for _, h := range []nvmefmt.Hash{nvmefmt.HashNone, nvmefmt.SHA256, nvmefmt.SHA384} {
		for _, n := range tlsLengths[h] {
			seed++
			s, _ := nvmefmt.EncodeTLSPSK(h, testBytes(seed, n))
			f.Add(s)
		}
	}
	for _, tc := range malformedKeys("NVMeTLSkey-1:", nvmefmt.SHA384) {
		f.Add(tc.s)
	}
	f.Add("NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := nvmefmt.ParseTLSPSK(s)
		if err != nil {
			checkParseError(t, err)
			return
		}
		again, err := nvmefmt.EncodeTLSPSK(k.Hash, k.PSK)
		if err != nil || again != s {
			t.Fatalf("ParseTLSPSK accepted %q, which re-encodes to %q, %v", s, again, err)
		}
		// Every accepted key must derive, and deterministically.
		a, err := nvmefmt.DeriveTLS(k, "nqn.fuzz-host", "nqn.fuzz-subsys")
		if err != nil {
			t.Fatalf("DeriveTLS of a parsed key: %v", err)
		}
		b, _ := nvmefmt.DeriveTLS(k, "nqn.fuzz-host", "nqn.fuzz-subsys")
		if a.IdentityV1 != b.IdentityV1 || !bytes.Equal(a.PSKV1, b.PSKV1) {
			t.Fatalf("DeriveTLS is not deterministic")
		}
	})
}
