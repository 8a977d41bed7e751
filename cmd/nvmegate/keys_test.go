package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// offline runs the CLI without any identity: the key commands need none.
func offline(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := newApp(&out, &errOut)
	defer a.close()
	root := a.root()
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// libnvme test/psk.c: configured key 5512DB… → its interchange string and
// the v1 identity digest for nqn.psk-test-host / nqn.psk-test-subsys.
const (
	pskHex     = "5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03"
	pskKey     = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
	pskDigest  = "iSbjiStwJ/1TrTvDlt2fjFmzvsytOJelidNnA+X5lEU="
	pskHostNQN = "nqn.psk-test-host"
	pskSubNQN  = "nqn.psk-test-subsys"
)

func TestKeysFormatTLSPSK(t *testing.T) {
	out, err := offline(t, "", "keys", "format", "tls-psk", "--secret", pskHex, "--hash", "sha256",
		"--hostnqn", pskHostNQN, "--subnqn", pskSubNQN, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Key, IdentityV0, IdentityV1, TLSPSK string
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	got.Key, _ = raw["key"].(string)
	got.IdentityV0, _ = raw["identity_v0"].(string)
	got.IdentityV1, _ = raw["identity_v1"].(string)
	got.TLSPSK, _ = raw["tls_psk"].(string)
	if got.Key != pskKey {
		t.Errorf("key = %s, want libnvme's %s", got.Key, pskKey)
	}
	if got.IdentityV0 != "NVMe0R01 "+pskHostNQN+" "+pskSubNQN {
		t.Errorf("identity_v0 = %s", got.IdentityV0)
	}
	if got.IdentityV1 != "NVMe1R01 "+pskHostNQN+" "+pskSubNQN+" "+pskDigest {
		t.Errorf("identity_v1 = %s, want libnvme's digest %s", got.IdentityV1, pskDigest)
	}
	if len(got.TLSPSK) != 64 {
		t.Errorf("tls_psk = %q, want 32 bytes of hex", got.TLSPSK)
	}
	// The same secret read from stdin gives the same key.
	out, err = offline(t, pskHex+"\n", "keys", "format", "tls-psk", "--secret", "-")
	if err != nil || lastLine(out) != pskKey {
		t.Fatalf("from stdin: %q, %v", out, err)
	}
	if _, err := offline(t, "", "keys", "format", "tls-psk", "--secret", pskHex, "--hostnqn", pskHostNQN); err == nil {
		t.Fatal("--hostnqn without --subnqn accepted")
	}
}

func TestKeysFormatParseGenDHCHAP(t *testing.T) {
	secret := strings.Repeat("00", 31) + "01"
	out, err := offline(t, "", "keys", "format", "dhchap", "--secret", secret, "--hash", "sha256")
	if err != nil {
		t.Fatal(err)
	}
	key := lastLine(out)
	if !strings.HasPrefix(key, "DHHC-1:01:") || !strings.HasSuffix(key, ":") {
		t.Fatalf("format dhchap printed %q", key)
	}
	out, err = offline(t, "", "keys", "parse", key)
	if err != nil || !strings.Contains(out, "dhchap") || !strings.Contains(out, "sha256") || !strings.Contains(out, "32-byte") {
		t.Fatalf("parse: %q, %v", out, err)
	}
	body := strings.Split(key, ":")[2]
	if strings.Contains(out, body) || strings.Contains(out, secret) {
		t.Fatalf("parse printed the secret: %q", out)
	}

	blob, _ := base64.StdEncoding.DecodeString(body)
	blob[len(blob)-1] ^= 1
	badCRC := "DHHC-1:01:" + base64.StdEncoding.EncodeToString(blob) + ":"
	for name, tc := range map[string]struct{ s, want string }{
		"bad CRC":    {badCRC, "CRC"},
		"no trailer": {strings.TrimSuffix(key, ":"), "trailer"},
		"bad hash":   {strings.Replace(key, ":01:", ":07:", 1), "hash"},
		"bad prefix": {"DHHC-2:01:" + body + ":", "prefix"},
		"short":      {"DHHC-1:01:AAAA:", "length"},
	} {
		_, err := offline(t, "", "keys", "parse", tc.s)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%s: parse error %v, want it to name %q", name, err, tc.want)
		} else if strings.Contains(err.Error(), body) {
			t.Errorf("%s: error repeats the key body", name)
		}
	}

	for _, hash := range []string{"none", "sha256", "sha384", "sha512"} {
		out, err := offline(t, "", "keys", "gen", "dhchap", "--hash", hash)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := offline(t, "", "keys", "parse", lastLine(out)); err != nil || !strings.Contains(out, hash) {
			t.Fatalf("generated %s key does not parse back: %q %v", hash, out, err)
		}
	}
	a, _ := offline(t, "", "keys", "gen", "tls-psk", "--hash", "sha384")
	b, _ := offline(t, "", "keys", "gen", "tls-psk", "--hash", "sha384")
	if a == b || !strings.HasPrefix(a, "NVMeTLSkey-1:02:") {
		t.Fatalf("gen tls-psk: %q %q", a, b)
	}
	if _, err := offline(t, "", "keys", "format", "dhchap", "--secret", "xyz"); err == nil || strings.Contains(err.Error(), "xyz") {
		t.Fatalf("bad hex: %v", err)
	}
}

func TestHostNQNCommand(t *testing.T) {
	out, err := offline(t, "", "hostnqn", "spiffe://nvmegate.test/node/acme-gpu-1")
	if err != nil || strings.TrimSpace(out) != "nqn.2014-08.org.nvmexpress:uuid:a2d4ee77-c9d9-5e75-88d8-17c29342d6f1" {
		t.Fatalf("hostnqn: %q, %v", out, err)
	}
	if _, err := offline(t, "", "hostnqn", "not-a-spiffe-id"); err == nil {
		t.Fatal("hostnqn accepted a non-SPIFFE ID")
	}
}

func TestKeysRotateStatusCommands(t *testing.T) {
	dir := startDevGateway(t)
	acmeInventory(t, dir, "eu-west")
	out := mustCLI(t, dir, "admin", "keys", "rotate", "--subsystem", nqn, "--reason", "first")
	if !strings.Contains(out, "access-root") || !strings.Contains(out, "current, rotates") {
		t.Fatalf("rotate:\n%s", out)
	}
	mustCLI(t, dir, "admin", "keys", "rotate", "--subsystem", nqn)
	mustCLI(t, dir, "admin", "keys", "rotate", "--subsystem", nqn, "--nsid", "1")
	out = mustCLI(t, dir, "admin", "keys", "status")
	for _, want := range []string{"grace until", "hmac-sha256:", "data-key", nqn + "/1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	out = mustCLI(t, dir, "admin", "keys", "status", "--kind", "data-key")
	if strings.Contains(out, "access-root") {
		t.Fatalf("--kind data-key lists roots:\n%s", out)
	}
	if _, err := cli(t, dir, "admin", "keys", "status", "--kind", "dek"); err == nil || !strings.Contains(err.Error(), "--kind must be") {
		t.Fatalf("bad kind: %v", err)
	}
	if _, err := cli(t, dir, "acme-scheduler", "keys", "rotate", "--subsystem", nqn); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Fatalf("scheduler rotating: %v", err)
	}
}
