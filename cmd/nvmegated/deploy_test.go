package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The example configuration in deploy/ parses strictly (no unknown or
// misspelt key) and passes validation as shipped.
func TestDeployExampleConfig(t *testing.T) {
	c, err := loadConfig(filepath.Join("..", "..", "deploy", "nvmegated.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("deploy/nvmegated.yaml: %v", err)
	}
	if c.Keys.Backend != "vault" || c.Keys.Vault.Cert == nil || c.Audit.Vault.Key == "" || len(c.Targets.Remote) != 2 ||
		c.Identity.SPIFFEID == "" {
		t.Fatalf("the example lost a section: %+v", c)
	}
}

// The configuration in the Kubernetes manifests' ConfigMaps does too: the
// single gateway's and the replicas' on etcd.
func TestDeployKubernetesConfig(t *testing.T) {
	c := kubernetesConfig(t, "nvmegate.yaml")
	if c.Identity.SPIFFESocket == "" || c.StateDir != "/var/lib/nvmegate" || c.Etcd.enabled() {
		t.Fatalf("the ConfigMap's config lost a section: %+v", c)
	}
	ha := kubernetesConfig(t, "nvmegate-ha.yaml")
	if len(ha.Etcd.Endpoints) != 3 || ha.Etcd.CACert == "" || ha.Audit.Vault.Key == "" || ha.Keys.Backend != "vault" {
		t.Fatalf("the HA ConfigMap's config lost a section: %+v", ha)
	}
}

func kubernetesConfig(t *testing.T, file string) Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", file))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(data), "  nvmegated.yaml: |\n")
	if !ok {
		t.Fatal("no nvmegated.yaml in the ConfigMap")
	}
	var cfg strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if !strings.HasPrefix(line, "    ") {
			break // the block ends where the indentation does
		}
		cfg.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	path := filepath.Join(t.TempDir(), "nvmegated.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := loadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c.setDefaults()
	if err := c.validate(); err != nil {
		t.Fatalf("%s: the ConfigMap's config: %v\n%s", file, err, cfg.String())
	}
	return c
}
