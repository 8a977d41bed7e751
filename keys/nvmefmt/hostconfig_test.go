package nvmefmt_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

func TestHostNQNNamespaceIsDocumented(t *testing.T) {
	// The namespace is itself derived, so that it can be re-derived from its
	// documentation rather than trusted as a magic constant.
	if got := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://nvmegate.dev/ns/host-nqn/v1")); got != nvmefmt.HostNQNNamespace {
		t.Fatalf("HostNQNNamespace = %s, its documented derivation gives %s", nvmefmt.HostNQNNamespace, got)
	}
}

func TestHostNQNFromSPIFFEID(t *testing.T) {
	a, err := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test/node/acme-gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	// Pinned: a change here changes every default host NQN in the field.
	if a != "nqn.2014-08.org.nvmexpress:uuid:a2d4ee77-c9d9-5e75-88d8-17c29342d6f1" {
		t.Fatalf("derived %s", a)
	}
	if err := nvmegate.ValidateNQN("nqn", a); err != nil {
		t.Fatal(err)
	}
	b, _ := nvmefmt.HostNQNFromSPIFFEID("spiffe://nvmegate.test/node/acme-gpu-2")
	c, _ := nvmefmt.HostNQNFromSPIFFEID("spiffe://other.test/node/acme-gpu-1")
	if a == b || a == c || b == c {
		t.Fatalf("collisions: %s %s %s", a, b, c)
	}
	u := uuid.MustParse(strings.TrimPrefix(a, nvmegate.UUIDNQNPrefix))
	if u.Version() != 5 {
		t.Fatalf("UUID version %d, want 5", u.Version())
	}
	for _, bad := range []string{"", "spiffe://nvmegate.test", "https://nvmegate.test/node/x", "spiffe://Upper.test/node/x", "spiffe://t/a/../b"} {
		if _, err := nvmefmt.HostNQNFromSPIFFEID(bad); !errors.Is(err, nvmefmt.ErrSPIFFEID) {
			t.Errorf("HostNQNFromSPIFFEID(%q) = %v, want ErrSPIFFEID", bad, err)
		}
	}
}

func TestHostID(t *testing.T) {
	nqn := "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
	if got := nvmefmt.HostID(nqn); got != "f81d4fae-7dec-11d0-a765-00a0c91e6bf6" {
		t.Fatalf("HostID(uuid NQN) = %s", got)
	}
	other := nvmefmt.HostID("nqn.2026-01.io.example:host-1")
	if _, err := uuid.Parse(other); err != nil || other != nvmefmt.HostID("nqn.2026-01.io.example:host-1") || other == nvmefmt.HostID("nqn.2026-01.io.example:host-2") {
		t.Fatalf("HostID(named NQN) = %s", other)
	}
}

func testSecret(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i)*7
	}
	return b
}

func testConnection(t *testing.T) nvmefmt.Connection {
	t.Helper()
	host, err := nvmefmt.EncodeDHCHAP(nvmefmt.SHA384, testSecret(48, 1))
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := nvmefmt.EncodeDHCHAP(nvmefmt.SHA384, testSecret(48, 2))
	if err != nil {
		t.Fatal(err)
	}
	return nvmefmt.Connection{
		HostNQN:      "nqn.2014-08.org.nvmexpress:uuid:a2d4ee77-c9d9-5e75-88d8-17c29342d6f1",
		SubsystemNQN: "nqn.2026-01.io.nvmegate.demo:acme-train",
		Ports: []nvmefmt.Endpoint{
			{Transport: "tcp", Address: "10.0.0.10", ServiceID: "4420"},
			{Transport: "tcp", Address: "fd00::10", ServiceID: "4420"},
		},
		DHCHAPKey: host, DHCHAPCtrlKey: ctrl,
	}
}

func TestConnectArgs(t *testing.T) {
	c := testConnection(t)
	args, err := c.ConnectArgs(1)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--transport=tcp", "--traddr=fd00::10", "--trsvcid=4420",
		"--nqn=nqn.2026-01.io.nvmegate.demo:acme-train",
		"--hostnqn=nqn.2014-08.org.nvmexpress:uuid:a2d4ee77-c9d9-5e75-88d8-17c29342d6f1",
		"--hostid=a2d4ee77-c9d9-5e75-88d8-17c29342d6f1",
		"--dhchap-secret=" + c.DHCHAPKey, "--dhchap-ctrl-secret=" + c.DHCHAPCtrlKey,
	}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("ConnectArgs:\n got %q\nwant %q", args, want)
	}
	tlsKey, err := nvmefmt.EncodeTLSPSK(nvmefmt.SHA256, testSecret(32, 3))
	if err != nil {
		t.Fatal(err)
	}
	c.TLS, c.TLSKey, c.TLSKeyIdentity = true, tlsKey, "NVMe1R01 h s d="
	args, err = c.ConnectArgs(0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(args, "--tls") || !slices.Contains(args, "--tls-key="+tlsKey) || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--tls-key-identity") }) {
		t.Fatalf("TLS args missing: %q", args)
	}
	if _, err := c.ConnectArgs(2); err == nil {
		t.Fatal("ConnectArgs(out of range) succeeded")
	}
}

func TestConnectionValidate(t *testing.T) {
	for name, mut := range map[string]func(*nvmefmt.Connection){
		"host nqn":          func(c *nvmefmt.Connection) { c.HostNQN = "host" },
		"subsystem nqn":     func(c *nvmefmt.Connection) { c.SubsystemNQN = "" },
		"host id":           func(c *nvmefmt.Connection) { c.HostID = "not-a-uuid" },
		"no ports":          func(c *nvmefmt.Connection) { c.Ports = nil },
		"transport":         func(c *nvmefmt.Connection) { c.Ports[0].Transport = "fc" },
		"address":           func(c *nvmefmt.Connection) { c.Ports[0].Address = "storage.example" },
		"service":           func(c *nvmefmt.Connection) { c.Ports[0].ServiceID = "0" },
		"ctrl without host": func(c *nvmefmt.Connection) { c.DHCHAPKey = "" },
		"bad host key":      func(c *nvmefmt.Connection) { c.DHCHAPKey = c.DHCHAPKey[:len(c.DHCHAPKey)-2] + "A:" },
		"tls key without tls": func(c *nvmefmt.Connection) {
			c.TLSKey, _ = nvmefmt.EncodeTLSPSK(nvmefmt.SHA256, testSecret(32, 3))
		},
		"no auth": func(c *nvmefmt.Connection) { c.DHCHAPKey, c.DHCHAPCtrlKey = "", "" },
	} {
		c := testConnection(t)
		c.Ports = slices.Clone(c.Ports)
		mut(&c)
		err := c.Validate()
		if !errors.Is(err, nvmefmt.ErrConnection) {
			t.Errorf("%s: Validate = %v, want ErrConnection", name, err)
			continue
		}
		// No error repeats a secret.
		for _, s := range []string{testConnection(t).DHCHAPKey, testConnection(t).DHCHAPCtrlKey} {
			body := strings.Split(s, ":")[2]
			if strings.Contains(err.Error(), body) {
				t.Errorf("%s: error %q contains a secret", name, err)
			}
		}
	}
}

// nvme-cli is the oracle for config.json: `nvme config -J FILE -O` reads our
// document and must dump the same hosts, subsystems, ports and keys. (libnvme
// keeps tls_key from 1.4 and tls_key_identity from 1.11 on; nvme-cli 2.3 with
// libnvme 1.3 drops both, so they are compared only when the dump has them.)
func TestConfigJSONAcceptedByNVMeCLI(t *testing.T) {
	nvme := nvmeCLI(t)
	dhchapOnly := testConnection(t)
	withTLS := testConnection(t)
	withTLS.TLS = true
	withTLS.TLSKey, _ = nvmefmt.EncodeTLSPSK(nvmefmt.SHA256, testSecret(32, 3))
	withTLS.TLSKeyIdentity = "NVMe1R01 " + withTLS.HostNQN + " " + withTLS.SubsystemNQN + " digest="
	for name, c := range map[string]nvmefmt.Connection{"dhchap": dhchapOnly, "dhchap+tls": withTLS} {
		t.Run(name, func(t *testing.T) {
			doc, err := c.ConfigJSON()
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "config.json")
			if err := os.WriteFile(path, doc, 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			cmd := exec.CommandContext(ctx, nvme, "config", "-J", path, "-O")
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("nvme config -J -O: %v\n%s", err, stderr.String())
			}
			ours, theirs := ports(t, doc), ports(t, out)
			if len(ours) != len(c.Ports) || len(theirs) != len(ours) {
				t.Fatalf("ports: ours %d, nvme-cli's %d, want %d\n%s", len(ours), len(theirs), len(c.Ports), out)
			}
			for i := range ours {
				for _, k := range []string{"tls_key", "tls_key_identity"} {
					if _, ok := theirs[i][k]; !ok && ours[i][k] != nil {
						t.Logf("this libnvme does not keep %s", k)
						delete(ours[i], k)
					}
				}
				if !reflect.DeepEqual(ours[i], theirs[i]) {
					t.Errorf("port %d:\n ours   %v\n theirs %v", i, ours[i], theirs[i])
				}
			}
		})
	}
}

// ports flattens a config.json document to its ports, each with the host and
// subsystem fields it belongs to, sorted by address: libnvme does not keep
// the order of ports.
func ports(t *testing.T, doc []byte) []map[string]any {
	t.Helper()
	var hosts []struct {
		HostNQN    string `json:"hostnqn"`
		HostID     string `json:"hostid"`
		Subsystems []struct {
			NQN   string           `json:"nqn"`
			Ports []map[string]any `json:"ports"`
		} `json:"subsystems"`
	}
	if err := json.Unmarshal(doc, &hosts); err != nil {
		t.Fatalf("not a config.json document: %v\n%s", err, doc)
	}
	var out []map[string]any
	for _, h := range hosts {
		for _, s := range h.Subsystems {
			for _, p := range s.Ports {
				p["hostnqn"], p["hostid"], p["nqn"] = h.HostNQN, h.HostID, s.NQN
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, func(a, b map[string]any) int {
		return strings.Compare(a["traddr"].(string)+"/"+a["trsvcid"].(string), b["traddr"].(string)+"/"+b["trsvcid"].(string))
	})
	return out
}

func nvmeCLI(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("nvme")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nvme-cli is required on CI (apt-get install -y nvme-cli)")
		}
		t.Skip("nvme-cli not installed")
	}
	return path
}

func TestKernelOptions(t *testing.T) {
	c := testConnection(t)
	got, err := c.KernelOptions(1, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	want := "nqn=nqn.2026-01.io.nvmegate.demo:acme-train,transport=tcp,traddr=fd00::10,trsvcid=4420," +
		"hostnqn=nqn.2014-08.org.nvmexpress:uuid:a2d4ee77-c9d9-5e75-88d8-17c29342d6f1,hostid=a2d4ee77-c9d9-5e75-88d8-17c29342d6f1," +
		"dhchap_secret=" + c.DHCHAPKey + ",dhchap_ctrl_secret=" + c.DHCHAPCtrlKey
	if got != want {
		t.Fatalf("KernelOptions:\n got %q\nwant %q", got, want)
	}
	c.TLS = true
	if _, err := c.KernelOptions(0, 0, false); !errors.Is(err, nvmefmt.ErrConnection) {
		t.Fatalf("TLS without a keyring: %v, want ErrConnection", err)
	}
	got, err = c.KernelOptions(0, 0x1234, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got, ",tls,keyring=4660,duplicate_connect") || strings.Contains(got, "tls_key") {
		t.Fatalf("TLS options: %q", got)
	}
	if _, err := c.KernelOptions(2, 1, false); err == nil {
		t.Fatal("KernelOptions(out of range) succeeded")
	}
	c.SubsystemNQN = "nqn.2026-01.io.nvmegate.demo:a,tls_key=1"
	if _, err := c.KernelOptions(0, 1, false); !errors.Is(err, nvmefmt.ErrConnection) {
		t.Fatalf("an NQN with a comma: %v, want ErrConnection", err)
	}
}
