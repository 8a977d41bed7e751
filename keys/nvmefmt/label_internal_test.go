package nvmefmt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// RFC 8448 §3 (Simple 1-RTT Handshake), the server's key schedule: the early
// secret is HKDF-Extract(salt 0, IKM 32 zero bytes), and the "derived" secret
// is HKDF-Expand-Label(early, "derived", SHA-256(""), 32). Our expandLabel
// does both steps, so it must turn 32 zero bytes into that derived secret,
// through the info bytes the RFC prints.
func TestExpandLabelRFC8448(t *testing.T) {
	empty := sha256.Sum256(nil)
	wantInfo, _ := hex.DecodeString("00200d746c73313320646572697665642" +
		"0e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	info, err := hkdfLabel("derived", string(empty[:]), 32, false)
	if err != nil || !bytes.Equal(info, wantInfo) {
		t.Fatalf("hkdfLabel = %x, %v\nwant          %x", info, err, wantInfo)
	}
	got, err := expandLabel(SHA256, make([]byte, 32), "derived", string(empty[:]), 32, false)
	const want = "6f2615a108c702c5678f54fc9dbab69716c076189c48250cebeac3576c3611ba"
	if err != nil || hex.EncodeToString(got) != want {
		t.Fatalf("expandLabel = %x, %v; want %s (RFC 8448)", got, err, want)
	}
}

// The compat encoding of libnvme <= 1.15 (derive_retained_key with three
// add1_hkdf_info calls after the host-order length): no length bytes.
func TestHKDFLabelCompat(t *testing.T) {
	info, err := hkdfLabel("HostNQN", "nqn.h", 48, true)
	want := append([]byte{48, 0}, "tls13 HostNQNnqn.h"...)
	if err != nil || !bytes.Equal(info, want) {
		t.Fatalf("compat hkdfLabel = %q, %v; want %q", info, err, want)
	}
	info, err = hkdfLabel("HostNQN", "nqn.h", 48, false)
	want = append([]byte{0, 48, 13}, "tls13 HostNQN\x05nqn.h"...)
	if err != nil || !bytes.Equal(info, want) {
		t.Fatalf("hkdfLabel = %q, %v; want %q", info, err, want)
	}
	for _, tc := range []struct {
		label, context string
		length         int
	}{
		{string(make([]byte, 250)), "", 32},
		{"x", string(make([]byte, 256)), 32},
		{"x", "", 1 << 16},
		{"x", "", -1},
	} {
		if _, err := hkdfLabel(tc.label, tc.context, tc.length, false); err == nil {
			t.Errorf("hkdfLabel(label %d bytes, context %d bytes, length %d) succeeded", len(tc.label), len(tc.context), tc.length)
		}
	}
}
