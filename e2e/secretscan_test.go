package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
)

// The secret scan runs once, after the whole e2e run. Each test hands it
// what a secret must never reach — the gateway's and target agents' logs,
// metrics, audit databases and exports — with scanFiles/scanBytes, and the
// secrets it saw issued (a node's config, Vault credentials) with
// keepSecrets/keepSecret. TestMain then looks in everything for every
// secret, in each form it could leak in (as issued, its base64 body, the
// key bytes raw or in hex), and for the marker of any NVMe secret or
// private key.

// secretMarkers start a secret in any of the forms nvmegate handles.
var secretMarkers = []string{"DHHC-1:", "NVMeTLSkey-1:", "PRIVATE KEY"}

var scanSet = struct {
	sync.Mutex
	files   map[string][]byte // what must hold no secret, by name
	quoted  map[string][]byte // output that may name a marker (a CLI refusing a bad key) but must hold no issued secret
	secrets map[string]string // needle -> where the secret was seen
}{files: map[string][]byte{}, quoted: map[string][]byte{}, secrets: map[string]string{}}

// scanFiles reads each path (a file, or every file under a directory) when
// t ends — before its temp dirs are removed — for the scan after the run.
// A path that does not exist by then is skipped.
func scanFiles(t testing.TB, paths ...string) {
	t.Helper()
	t.Cleanup(func() {
		for _, p := range paths {
			filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				if data, err := os.ReadFile(path); err == nil {
					scanBytes(t.Name()+": "+path, data)
				}
				return nil
			})
		}
	})
}

// scanBytes adds content held in memory (metrics) to the scan.
func scanBytes(name string, data []byte) {
	scanSet.Lock()
	defer scanSet.Unlock()
	scanSet.files[name] = data
}

// scanQuoted adds output that may legitimately quote a secret's marker (a
// CLI echoing a malformed key it refused) but must hold no issued secret.
func scanQuoted(name string, data []byte) {
	scanSet.Lock()
	defer scanSet.Unlock()
	scanSet.quoted[name] = data
}

var nvmeSecretRE = regexp.MustCompile(`(DHHC-1|NVMeTLSkey-1):[0-9a-fA-F]{2}:([A-Za-z0-9+/=]+):`)

// keepSecrets records every DH-HMAC-CHAP and TLS PSK secret in data (a
// node's config as issued) and returns how many it found.
func keepSecrets(where string, data []byte) int {
	ms := nvmeSecretRE.FindAllSubmatch(data, -1)
	for _, m := range ms {
		keepSecret(where, string(m[0]))
		keepSecret(where, string(m[2]))
		if raw, err := base64.StdEncoding.DecodeString(string(m[2])); err == nil && len(raw) > 4 {
			key := raw[:len(raw)-4] // the CRC-32 follows the key
			keepSecret(where, string(key))
			keepSecret(where, hex.EncodeToString(key))
		}
	}
	return len(ms)
}

// keepSecret records one secret value (a Vault token, an AppRole secret ID).
func keepSecret(where, secret string) {
	if len(secret) < 8 {
		return // too short to search for without false matches
	}
	scanSet.Lock()
	defer scanSet.Unlock()
	scanSet.secrets[secret] = where
}

// runScan reports every secret or marker found, one line each.
func runScan() (summary string, found []string) {
	scanSet.Lock()
	defer scanSet.Unlock()
	var size int
	check := func(name string, data []byte, markers bool) {
		size += len(data)
		if markers {
			for _, m := range secretMarkers {
				if bytes.Contains(data, []byte(m)) {
					found = append(found, fmt.Sprintf("%s holds %q", name, m))
				}
			}
		}
		for s, where := range scanSet.secrets {
			if bytes.Contains(data, []byte(s)) {
				found = append(found, fmt.Sprintf("%s holds a secret issued in %s", name, where))
			}
		}
	}
	for name, data := range scanSet.files {
		check(name, data, true)
	}
	for name, data := range scanSet.quoted {
		check(name, data, false)
	}
	sort.Strings(found)
	summary = fmt.Sprintf("secret scan: %d files (%.1f MiB) searched for %d secret forms and %d markers",
		len(scanSet.files)+len(scanSet.quoted), float64(size)/(1<<20), len(scanSet.secrets), len(secretMarkers))
	return summary, found
}

func TestMain(m *testing.M) {
	code := m.Run()
	summary, found := runScan()
	fmt.Println(summary)
	if len(found) > 0 {
		fmt.Printf("FAIL: secrets outside the nodes' own configs:\n  %s\n", strings.Join(found, "\n  "))
		code = 1
	}
	os.Exit(code)
}

// The scan itself finds a secret in each form it could leak in, and a
// marker, and passes what holds none.
func TestSecretScanFinds(t *testing.T) {
	saved := scanSet.files
	savedQ, savedS := scanSet.quoted, scanSet.secrets
	scanSet.files, scanSet.quoted, scanSet.secrets = map[string][]byte{}, map[string][]byte{}, map[string]string{}
	defer func() { scanSet.files, scanSet.quoted, scanSet.secrets = saved, savedQ, savedS }()

	// A DHHC-1 secret: a 32-byte key and its CRC, base64.
	key := bytes.Repeat([]byte{0x5a, 0xa5, 0x3c, 0xc3}, 8)
	body := base64.StdEncoding.EncodeToString(append(append([]byte{}, key...), 1, 2, 3, 4))
	issued := "DHHC-1:01:" + body + ":"
	if n := keepSecrets("config", []byte(`{"dhchap_key":"`+issued+`"}`)); n != 1 {
		t.Fatalf("keepSecrets found %d secrets, want 1", n)
	}
	scanBytes("clean", []byte("level=INFO msg=granted grant=g-1"))
	scanBytes("base64", []byte("key="+body))
	scanBytes("hex", []byte("key="+hex.EncodeToString(key)))
	scanBytes("raw", append([]byte("db\x00"), key...))
	scanBytes("marker", []byte("NVMeTLSkey-1:01:xyz:"))
	scanQuoted("cli", []byte("refused: DHHC-1:00:AAAA: CRC mismatch"))
	_, found := runScan()
	want := []string{
		`base64 holds a secret issued in config`,
		`hex holds a secret issued in config`,
		`marker holds "NVMeTLSkey-1:"`,
		`raw holds a secret issued in config`,
	}
	if strings.Join(found, "\n") != strings.Join(want, "\n") {
		t.Fatalf("found:\n%s\nwant:\n%s", strings.Join(found, "\n"), strings.Join(want, "\n"))
	}
}
