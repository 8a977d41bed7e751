package gateway_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/nvmegate/nvmegate/gateway"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/lease"
)

// What a gateway serves is wired explicitly; New refuses a grant
// lifecycle it could not serve consistently, saying which part is
// missing.
func TestNewRefusesInconsistentWiring(t *testing.T) {
	g := startGateway(t)
	km, err := keys.NewManager(keys.Options{Backend: g.keyStore})
	if err != nil {
		t.Fatal(err)
	}
	lc, err := lease.New(lease.Config{Grants: g.db, Inventory: g.db, Keys: km, Audit: g.audit, Targets: g.agent})
	if err != nil {
		t.Fatal(err)
	}
	base := gateway.Config{Credentials: insecure.NewCredentials(), Store: g.db, Authorizer: g.engine, Audit: g.audit}
	for want, mod := range map[string]func(c *gateway.Config){
		"Lease needs Jobs":    func(c *gateway.Config) { c.Lease, c.Targets = lc, g.agent },
		"Lease needs Targets": func(c *gateway.Config) { c.Lease, c.Jobs = lc, g.db },
	} {
		c := base
		mod(&c)
		if _, err := gateway.New(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v, want an error saying %q", err, want)
		}
	}
	c := base
	c.Lease, c.Jobs, c.Targets = lc, g.db, g.agent
	if _, err := gateway.New(c); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.New(lease.Config{Grants: g.db, Inventory: g.db, Keys: km, Audit: g.audit}); err == nil {
		t.Fatal("lease.New without Targets")
	}
}
