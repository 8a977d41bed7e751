package nvmefmt_test

import (
	"bytes"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// Published vectors. Each row names its source: repository, file, and the
// commit at which the vector was read. The vectors are data; no code was
// taken from these files.
const (
	// linux-nvme/libnvme test/psk.c, last changed by fde6b1f5 ("libnvme: TLS
	// PSK derivation fixes"), read at 03297d8bf6f7ede5ff88d51429808f65c673b58e.
	srcLibnvmePSK = "libnvme test/psk.c @ fde6b1f51646f7f0b4a12f61f08e2bb621f01903"
	// linux-nvme/libnvme test/config/data/tls_key-1.json.
	srcLibnvmeTLSJSON = "libnvme test/config/data/tls_key-1.json @ e36b4303dbc0a1209d52468d1e1a91de4b773977"
	// torvalds/linux drivers/nvme/common/tests/auth_kunit.c (the nvme-auth
	// KUnit suite).
	srcKernelKUnit = "linux drivers/nvme/common/tests/auth_kunit.c @ 7fe6ac157b7e15c8976bd62ad7cb98e248884e83"
	// Recorded from the oracle: Debian 12 nvme-cli 2.4+really2.3-3 (nvme-cli
	// 2.3, libnvme 1.3), `nvme gen-dhchap-key --secret=HEX --hmac=N
	// --key-length=L --nqn=nqn.psk-test-host`. TestNVMeCLIGenDHCHAPKey checks
	// the same thing live when nvme-cli is installed.
	srcNVMeCLI23 = "nvme-cli 2.3 gen-dhchap-key (recorded)"
)

// The configured PSKs of libnvme test/psk.c. The 48-byte one is the 32-byte
// one followed by its last 16 bytes again.
var (
	libnvmePSK32 = mustHex("5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03")
	libnvmePSK48 = mustHex("5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03" +
		"FFC344BCF442E2DD6D8BC4870B5D5B03")
	libnvmePSK64 = mustHex("5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03" +
		"5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03")
)

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func TestTLSPSKInterchangeVectors(t *testing.T) {
	for _, tc := range []struct {
		source string
		hash   nvmefmt.Hash
		psk    []byte
		want   string
	}{
		{srcLibnvmePSK, nvmefmt.HashNone, libnvmePSK32, "NVMeTLSkey-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"},
		{srcLibnvmePSK, nvmefmt.SHA256, libnvmePSK32, "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"},
		{srcLibnvmePSK, nvmefmt.SHA384, libnvmePSK48, "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:"},
	} {
		got, err := nvmefmt.EncodeTLSPSK(tc.hash, tc.psk)
		if err != nil || got != tc.want {
			t.Errorf("%s: EncodeTLSPSK(%s) = %q, %v; want %q", tc.source, tc.hash, got, err, tc.want)
		}
		k, err := nvmefmt.ParseTLSPSK(tc.want)
		if err != nil || k.Hash != tc.hash || !bytes.Equal(k.PSK, tc.psk) {
			t.Errorf("%s: ParseTLSPSK(%q) = %v, %v; want hash %s and the vector's PSK", tc.source, tc.want, k, err, tc.hash)
		}
	}

	// A key with no published bytes: it must parse and re-encode unchanged.
	const fromJSON = "NVMeTLSkey-1:01:Hhc5sFjwSZ6w5hPY19tqprajYtuYci3tN+Z2wGViDk3rpSR+:"
	k, err := nvmefmt.ParseTLSPSK(fromJSON)
	if err != nil {
		t.Fatalf("%s: ParseTLSPSK: %v", srcLibnvmeTLSJSON, err)
	}
	if again, err := k.Encode(); err != nil || again != fromJSON {
		t.Errorf("%s: re-encoded %q, %v; want the input", srcLibnvmeTLSJSON, again, err)
	}
}

func TestIdentityV1Vectors(t *testing.T) {
	const host, sub = "nqn.psk-test-host", "nqn.psk-test-subsys"
	for _, tc := range []struct {
		source string
		hash   nvmefmt.Hash
		psk    []byte
		compat bool
		want   string
	}{
		{srcLibnvmePSK + " test_data_identity", nvmefmt.SHA256, libnvmePSK32, false,
			"NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU="},
		{srcLibnvmePSK + " test_data_identity", nvmefmt.SHA384, libnvmePSK48, false,
			"NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys QhW2+Rp6RzHlNtCslyRxMnwJ11tKKhz8JCAQpQ+XUD8f9td1VeH5h53yz2wKJG1a"},
		{srcLibnvmePSK + " test_data_identity_compat", nvmefmt.SHA256, libnvmePSK32, true,
			"NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM="},
		{srcLibnvmePSK + " test_data_identity_compat", nvmefmt.SHA384, libnvmePSK48, true,
			"NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz"},
	} {
		var opts []nvmefmt.Option
		if tc.compat {
			opts = append(opts, nvmefmt.CompatLabels())
		}
		retained, err := nvmefmt.RetainedPSK(tc.hash, tc.psk, host, opts...)
		if err != nil {
			t.Fatalf("%s: RetainedPSK: %v", tc.source, err)
		}
		got, err := nvmefmt.IdentityV1(tc.hash, retained, host, sub)
		if err != nil || got != tc.want {
			t.Errorf("%s (compat %v): IdentityV1 = %q, %v; want %q", tc.source, tc.compat, got, err, tc.want)
		}
		creds, err := nvmefmt.DeriveTLS(nvmefmt.TLSKey{Hash: tc.hash, PSK: tc.psk}, host, sub, opts...)
		if err != nil || creds.IdentityV1 != tc.want {
			t.Errorf("%s (compat %v): DeriveTLS().IdentityV1 = %q, %v; want %q", tc.source, tc.compat, creds.IdentityV1, err, tc.want)
		}
	}
}

// TestKernelKUnitVectors reproduces the kernel's nvme-auth KUnit suite: a PSK
// generated from fixed inputs, its digest for host "hostnqn" and subsystem
// "subsysnqn", and the TLS PSK derived from both. The derivation from an
// input PSK is the same for a generated PSK (the kernel's case) and a
// retained one (ours).
func TestKernelKUnitVectors(t *testing.T) {
	for _, tc := range []struct {
		hash   nvmefmt.Hash
		psk    string // expected_psk: HMAC(skey, c1 || c2)
		digest string // expected_psk_digest; "" where the kernel refuses the hash
		tlsPSK string // expected_tls_psk
	}{
		{nvmefmt.SHA256,
			"1733c59fa7f48fcf37f5f26fc4ff0268ad4f78e030f4f3b0bfd1d47e7bb1447a",
			"OldoKuTfKddMuyCznAZojkWD7P4D9/AtzDzLimtOxqI=",
			"3c17da628474a04d2247c4cab47968c915388193f7c071bd9489cc3666cd7cc8"},
		{nvmefmt.SHA384,
			"f14b2dd3234c459694d3bc63f8968bd6b37c2c6de849e22e118749001ce4bbe8640b9e3a748cb11ce4b1d71d359cce39",
			"cffMWk8TSS7HOQebjgYEIkrPrjWPV4JE5cdPB8WhEvY4JBW5YynKyv66XscN4A9n",
			"2774753233537b3fa50eb7d16a8e43457d85f4906c005b2236616c5d80939d0898fff15bb8b77119d2be0aac423e7590"},
		{nvmefmt.SHA512,
			"9c9f089a618b47d2d75f4b6c28070424487b445dd96e70c4c09b55e8b6000152a3363c3454043f38f0b85036ded40655350aa87b8b6a282b5c1acae16233dd5b",
			"", ""},
	} {
		t.Run(tc.hash.String(), func(t *testing.T) {
			psk := mustHex(tc.psk)
			// Check the transcription of the inputs: skey[i] = 'A'+i,
			// c1[i] = i, c2[i] = 0xff-i, each hash-size long.
			n := tc.hash.Size()
			skey, c1, c2 := make([]byte, n), make([]byte, n), make([]byte, n)
			for i := range n {
				skey[i], c1[i], c2[i] = 'A'+byte(i), byte(i), 0xff-byte(i)
			}
			m := hmac.New(kunitHash(tc.hash), skey)
			m.Write(c1)
			m.Write(c2)
			if !bytes.Equal(m.Sum(nil), psk) {
				t.Fatalf("%s: generated PSK does not match; vector mistyped", srcKernelKUnit)
			}

			digest, err := nvmefmt.PSKDigest(tc.hash, psk, "hostnqn", "subsysnqn")
			if tc.digest == "" {
				// The kernel refuses SHA-512 digests (-EINVAL); so do we.
				if !errors.Is(err, nvmefmt.ErrHash) {
					t.Fatalf("PSKDigest(%s) error = %v, want ErrHash", tc.hash, err)
				}
				return
			}
			if err != nil || digest != tc.digest {
				t.Fatalf("%s: PSKDigest = %q, %v; want %q", srcKernelKUnit, digest, err, tc.digest)
			}
			got, err := nvmefmt.TLSPSK(tc.hash, psk, digest)
			if err != nil || hex.EncodeToString(got) != tc.tlsPSK {
				t.Fatalf("%s: TLSPSK = %x, %v; want %s", srcKernelKUnit, got, err, tc.tlsPSK)
			}
		})
	}
}

func TestDHCHAPVectors(t *testing.T) {
	const nqn = "nqn.psk-test-host"
	for _, tc := range []struct {
		source string
		hash   nvmefmt.Hash
		secret []byte
		// want is what nvme-cli printed: for hash 00 the encoded secret, for
		// 01-03 the encoded transform of the secret (nvme-cli 2.x prints
		// HMAC_hh(secret, nqn || "NVMe-over-Fabrics") under hh).
		want string
	}{
		{srcNVMeCLI23, nvmefmt.HashNone, libnvmePSK32,
			"DHHC-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"},
		{srcNVMeCLI23, nvmefmt.HashNone, libnvmePSK48,
			"DHHC-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:"},
		{srcNVMeCLI23, nvmefmt.HashNone, libnvmePSK64,
			"DHHC-1:00:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNVEtu2c30BBvZZdbdz37AR/8NEvPRC4t1ti8SHC11bA9/eghk=:"},
		{srcNVMeCLI23, nvmefmt.SHA256, libnvmePSK32,
			"DHHC-1:01:90WR+faTu56Irm7wBhqqFpgGtTS9wPq4KziON4skLgpjUHdc:"},
		{srcNVMeCLI23, nvmefmt.SHA384, libnvmePSK48,
			"DHHC-1:02:ObSGkprKpncz8Qr0i1YuMGatMkLi/w735laLxM3j8SXSWFrT/RhdIPXXCAO50X+QpXFA6Q==:"},
		{srcNVMeCLI23, nvmefmt.SHA512, libnvmePSK64,
			"DHHC-1:03:bxuZ2SoHb30FfrAWlwy3zRI0CHLzCH331VfVublhfoUEXgsiKMR3/R7LrsDzSxOf5EuR+caPVze35EU5u2NZ0FaPaSc=:"},
	} {
		transformed, err := nvmefmt.TransformDHCHAP(nvmefmt.DHCHAPKey{Hash: tc.hash, Secret: tc.secret}, nqn)
		if err != nil {
			t.Fatalf("%s: TransformDHCHAP(%s): %v", tc.source, tc.hash, err)
		}
		got, err := nvmefmt.EncodeDHCHAP(tc.hash, transformed)
		if err != nil || got != tc.want {
			t.Errorf("%s: EncodeDHCHAP(%s, transform) = %q, %v; want %q", tc.source, tc.hash, got, err, tc.want)
		}
		k, err := nvmefmt.ParseDHCHAP(tc.want)
		if err != nil || k.Hash != tc.hash || !bytes.Equal(k.Secret, transformed) {
			t.Errorf("%s: ParseDHCHAP(%q) = %v, %v", tc.source, tc.want, k, err)
		}
	}
}
