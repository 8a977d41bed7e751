package keys_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

var (
	root1 = keys.Root{Version: 1, Secret: bytes.Repeat([]byte{0x11}, 32), Created: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	root2 = keys.Root{Version: 2, Secret: bytes.Repeat([]byte{0x22}, 32), Created: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)}
	host1 = "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	host2 = "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000"
	sub   = "nqn.2026-01.io.nvmegate.test:acme-train"
	all   = keys.CredentialParams{DHCHAPHash: nvmefmt.SHA384, Bidirectional: true, TLSHash: nvmefmt.SHA256}
)

// Every derived secret is in its NVMe format, of the hash's size, and
// distinct per label, host, subsystem and root version.
func TestDeriveSeparation(t *testing.T) {
	seen := map[string]string{}
	add := func(what, v string) {
		if v == "" {
			t.Fatalf("%s empty", what)
		}
		if prev, ok := seen[v]; ok {
			t.Fatalf("%s equals %s", what, prev)
		}
		seen[v] = what
	}
	for _, r := range []keys.Root{root1, root2} {
		for _, h := range []string{host1, host2} {
			for _, s := range []string{sub, sub + "-2"} {
				c, err := keys.Derive(r, h, s, all)
				if err != nil {
					t.Fatal(err)
				}
				id := fmt.Sprintf("v%d %s %s", r.Version, h[len(h)-4:], s[len(s)-2:])
				add(id+" host", c.HostSecret)
				add(id+" ctrl", c.CtrlSecret)
				add(id+" tls", c.TLSPSK)
				k, err := nvmefmt.ParseDHCHAP(c.HostSecret)
				if err != nil || k.Hash != nvmefmt.SHA384 || len(k.Secret) != 48 {
					t.Fatalf("host secret: %v", err)
				}
				tk, err := nvmefmt.ParseTLSPSK(c.TLSPSK)
				if err != nil || tk.Hash != nvmefmt.SHA256 || len(tk.PSK) != 32 {
					t.Fatalf("tls psk: %v", err)
				}
				if !strings.HasPrefix(c.HostSecretFingerprint, "hmac-sha256:") || c.RootFingerprint != keys.RootFingerprint(r) {
					t.Fatalf("fingerprints %q %q", c.HostSecretFingerprint, c.RootFingerprint)
				}
			}
		}
	}
	// Deterministic: every gateway derives the same.
	a, _ := keys.Derive(root1, host1, sub, all)
	b, _ := keys.Derive(root1, host1, sub, all)
	if a != b {
		t.Fatal("derivation is not deterministic")
	}
	// Only what is asked for.
	c, err := keys.Derive(root1, host1, sub, keys.CredentialParams{DHCHAPHash: nvmefmt.SHA256})
	if err != nil || c.CtrlSecret != "" || c.TLSPSK != "" || c.HostSecret == "" {
		t.Fatalf("host secret only: %v", err)
	}
	for name, p := range map[string]keys.CredentialParams{
		"bidirectional without hash": {Bidirectional: true},
		"tls sha512":                 {TLSHash: nvmefmt.SHA512},
	} {
		if _, err := keys.Derive(root1, host1, sub, p); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	if _, err := keys.Derive(keys.Root{Version: 1, Secret: []byte("short")}, host1, sub, all); err == nil {
		t.Error("short root accepted")
	}
}

// Roots and credentials print redacted in every way we print things.
func TestRedaction(t *testing.T) {
	c, err := keys.Derive(root1, host1, sub, all)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logged, nil))
	log.Info("x", "creds", c, "root", root1)
	out := fmt.Sprintf("%v %+v %#v %s %v %+v %#v", c, c, c, c, root1, root1, root1) + logged.String()
	for _, secret := range []string{c.HostSecret, c.CtrlSecret, c.TLSPSK, "EREREREREREREREREREREREREREREREREREREREREREQ", strings.Repeat("11", 32)} {
		if strings.Contains(out, secret) || strings.Contains(out, secret[8:20]) {
			t.Fatalf("secret printed: %s", out)
		}
	}
	if !strings.Contains(out, "redacted") {
		t.Fatalf("no redaction marker: %s", out)
	}
}

// nvme-cli accepts what we derive (CI installs it; elsewhere skipped).
func TestDerivedSecretsNVMeCLI(t *testing.T) {
	nvme, err := exec.LookPath("nvme")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nvme-cli missing under CI")
		}
		t.Skip("nvme-cli not installed")
	}
	for _, h := range []nvmefmt.Hash{nvmefmt.SHA256, nvmefmt.SHA384, nvmefmt.SHA512} {
		c, err := keys.Derive(root2, host1, sub, keys.CredentialParams{DHCHAPHash: h, Bidirectional: true, TLSHash: nvmefmt.SHA384})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{c.HostSecret, c.CtrlSecret} {
			if out, err := exec.Command(nvme, "check-dhchap-key", "-k", s).CombinedOutput(); err != nil {
				t.Fatalf("check-dhchap-key: %v: %s", err, out)
			}
		}
		if out, err := exec.Command(nvme, "check-tls-key", "-k", c.TLSPSK).CombinedOutput(); err != nil {
			t.Fatalf("check-tls-key: %v: %s", err, out)
		}
	}
}
