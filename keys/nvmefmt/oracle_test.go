package nvmefmt_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// nvme-cli as the oracle: what we emit must be what nvme-cli (and the libnvme
// under it) accepts and produces. The tests skip without nvme-cli, except on
// CI (CI=true), which installs it and must not skip silently. Keys go to
// nvme-cli as separate argv entries, never through a shell. They are test
// keys; nvme-cli may echo them in its own error output.

// nvmeOracle returns the path of the nvme binary.
func nvmeOracle(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("nvme")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nvme-cli is required on CI (apt-get install -y nvme-cli)")
		}
		t.Skip("nvme-cli not installed; the oracle tests need it")
	}
	return path
}

// runNVMe runs nvme with args and a timeout; err is non-nil on a non-zero
// exit.
func runNVMe(t *testing.T, nvme string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, nvme, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("nvme %s: timed out", args[0])
	}
	return out.String(), errOut.String(), err
}

// lastLine returns the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// check-dhchap-key and, up to nvme-cli 2.x, check-tls-key -k print this line
// for a valid key.
var validKeyRE = regexp.MustCompile(`Key is valid \(HMAC (\d+), length (\d+), CRC ([0-9a-f]{8})\)`)

// checkValidLine compares nvme-cli's "Key is valid" line with what we know.
func checkValidLine(t *testing.T, out string, h nvmefmt.Hash, secret []byte) {
	t.Helper()
	m := validKeyRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("nvme-cli accepted the key but printed %q", out)
	}
	crc := fmt.Sprintf("%08x", crc32.ChecksumIEEE(secret))
	if m[1] != strconv.Itoa(int(h)) || m[2] != strconv.Itoa(len(secret)) || m[3] != crc {
		t.Fatalf("nvme-cli read HMAC %s, length %s, CRC %s; we wrote %d, %d, %s", m[1], m[2], m[3], h, len(secret), crc)
	}
}

func TestNVMeCLICheckDHCHAPKey(t *testing.T) {
	nvme := nvmeOracle(t)
	seed := uint64(1000)
	for _, h := range allHashes {
		for _, n := range dhchapLengths[h] {
			for range 4 {
				seed++
				secret := testBytes(seed, n)
				key, err := nvmefmt.EncodeDHCHAP(h, secret)
				if err != nil {
					t.Fatal(err)
				}
				out, errOut, err := runNVMe(t, nvme, "check-dhchap-key", "--key="+key)
				if err != nil {
					t.Fatalf("nvme check-dhchap-key refused our %s key with a %d-byte secret: %v\n%s%s", h, n, err, out, errOut)
				}
				checkValidLine(t, out, h, secret)
			}
		}
	}
}

// TestNVMeCLICheckTLSKey runs check-tls-key on our interchange keys. nvme-cli
// up to 2.x takes --key and prints the "Key is valid" line; later versions
// take --keydata with the NQNs and print the PSK identity instead, which we
// compare with ours (v0 always; v1 with the HkdfLabel encoding of that
// libnvme: RFC 8446 from 1.16, compat before).
func TestNVMeCLICheckTLSKey(t *testing.T) {
	nvme := nvmeOracle(t)
	help, helpErr, _ := runNVMe(t, nvme, "check-tls-key", "--help")
	keydata := strings.Contains(help+helpErr, "--keydata")
	libMajor, libMinor := libnvmeVersion(t, nvme)
	t.Logf("check-tls-key takes --keydata: %v; libnvme %d.%d", keydata, libMajor, libMinor)

	seed := uint64(2000)
	refused00 := false
	for _, h := range []nvmefmt.Hash{nvmefmt.HashNone, nvmefmt.SHA256, nvmefmt.SHA384} {
		for _, n := range tlsLengths[h] {
			for range 4 {
				seed++
				k := nvmefmt.TLSKey{Hash: h, PSK: testBytes(seed, n)}
				key, err := k.Encode()
				if err != nil {
					t.Fatal(err)
				}
				if !keydata {
					out, errOut, err := runNVMe(t, nvme, "check-tls-key", "--key="+key)
					if err != nil && h == nvmefmt.HashNone {
						// nvme-cli 2.3 accepts only hh 01 and 02 (doc.go).
						if !refused00 {
							t.Logf("this nvme-cli refuses hash 00 keys: %s", strings.TrimSpace(errOut))
						}
						refused00 = true
						continue
					}
					if err != nil {
						t.Fatalf("nvme check-tls-key refused our %s key of %d bytes: %v\n%s%s", h, n, err, out, errOut)
					}
					checkValidLine(t, out, h, k.PSK)
					continue
				}
				creds, err := nvmefmt.DeriveTLS(k, testHost, testSub)
				if err != nil {
					t.Fatal(err)
				}
				compat, err := nvmefmt.DeriveTLS(k, testHost, testSub, nvmefmt.CompatLabels())
				if err != nil {
					t.Fatal(err)
				}
				want := map[string]string{"0": creds.IdentityV0, "1": creds.IdentityV1}
				if libMajor == 1 && libMinor < 16 {
					want["1"] = compat.IdentityV1
				}
				for _, version := range []string{"0", "1"} {
					out, errOut, err := runNVMe(t, nvme, "check-tls-key", "--keydata="+key,
						"--hostnqn="+testHost, "--subsysnqn="+testSub, "--identity="+version)
					if err != nil {
						t.Fatalf("nvme check-tls-key --identity=%s refused our %s key of %d bytes: %v\n%s%s", version, h, n, err, out, errOut)
					}
					if got := lastLine(out); got != want[version] {
						t.Fatalf("identity v%s: nvme-cli %q, ours %q", version, got, want[version])
					}
				}
			}
		}
	}
}

// libnvmeVersion parses "libnvme version X.Y" from `nvme version`; 0, 0 if
// absent.
func libnvmeVersion(t *testing.T, nvme string) (major, minor int) {
	out, _, _ := runNVMe(t, nvme, "version")
	m := regexp.MustCompile(`libnvme version (\d+)\.(\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0, 0
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor
}

// TestNVMeCLIGenDHCHAPKey: gen-dhchap-key --hmac=0 must print exactly our
// encoding of the same secret, and --hmac=1..3 (nvme-cli 2.x) our encoding of
// the transformed secret, which checks TransformDHCHAP against libnvme's
// nvme_gen_dhchap_key. nvme-cli 3 no longer transforms; then the secret must
// come back unchanged.
func TestNVMeCLIGenDHCHAPKey(t *testing.T) {
	nvme := nvmeOracle(t)
	seed := uint64(3000)
	for _, h := range allHashes {
		for _, n := range dhchapLengths[h] {
			for range 3 {
				seed++
				secret := testBytes(seed, n)
				out, errOut, err := runNVMe(t, nvme, "gen-dhchap-key", "--secret="+hex.EncodeToString(secret),
					"--hmac="+strconv.Itoa(int(h)), "--key-length="+strconv.Itoa(n), "--nqn="+testHost)
				if err != nil {
					t.Fatalf("nvme gen-dhchap-key %s/%d: %v\n%s%s", h, n, err, out, errOut)
				}
				got := lastLine(out)
				if h == nvmefmt.HashNone {
					want, _ := nvmefmt.EncodeDHCHAP(h, secret)
					if got != want {
						t.Fatalf("hash none, %d bytes: nvme-cli %q, ours %q", n, got, want)
					}
					continue
				}
				k, err := nvmefmt.ParseDHCHAP(got)
				if err != nil || k.Hash != h {
					t.Fatalf("we cannot parse nvme-cli's %s key %q: %v", h, got, err)
				}
				transformed, err := nvmefmt.TransformDHCHAP(nvmefmt.DHCHAPKey{Hash: h, Secret: secret}, testHost)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case bytes.Equal(k.Secret, transformed):
				case bytes.Equal(k.Secret, secret):
					t.Logf("this nvme-cli does not transform the secret (nvme-cli 3 behaviour)")
				default:
					t.Fatalf("hash %s: nvme-cli's secret is neither ours transformed nor the input", h)
				}
			}
		}
	}
}
