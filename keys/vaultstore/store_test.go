package vaultstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	vault "github.com/hashicorp/vault/api"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/keystest"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	"github.com/nvmegate/nvmegate/keys/vaultstore"
)

func openToken(t *testing.T, v *vaulttest.Server, log *slog.Logger) *vaultstore.Store {
	t.Helper()
	s, err := vaultstore.Open(context.Background(), vaultstore.Config{Address: v.Addr, Token: v.Token, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The conformance suite against a real Vault, with the root token.
func TestConformanceToken(t *testing.T) {
	v := vaulttest.Start(t)
	keystest.Run(t, func(t *testing.T) keys.Backend { return openToken(t, v, nil) })
}

// approle configures AppRole with the shipped least-privilege policy
// (deploy/vault/nvmegate.hcl) and returns the login config.
func approle(t *testing.T, v *vaulttest.Server) *vaultstore.AppRole {
	t.Helper()
	ctx := context.Background()
	hcl, err := os.ReadFile(filepath.Join("..", "..", "deploy", "vault", "nvmegate.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Client.Sys().PutPolicyWithContext(ctx, "nvmegate", string(hcl)); err != nil {
		t.Fatal(err)
	}
	if err := v.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "approle", &vault.EnableAuthOptions{Type: "approle"}); err != nil {
		t.Fatal(err)
	}
	if err := v.Write(ctx, "auth/approle/role/nvmegate", map[string]any{
		"token_policies": "nvmegate", "token_ttl": "1h", "token_max_ttl": "24h"}); err != nil {
		t.Fatal(err)
	}
	rid, err := v.Client.Logical().Read("auth/approle/role/nvmegate/role-id")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := v.Client.Logical().Write("auth/approle/role/nvmegate/secret-id", nil)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "secret_id")
	if err := os.WriteFile(f, []byte(sid.Data["secret_id"].(string)), 0o600); err != nil {
		t.Fatal(err)
	}
	return &vaultstore.AppRole{RoleID: rid.Data["role_id"].(string), SecretIDFile: f}
}

// The suite again, logged in by AppRole under the shipped policy: the
// policy grants everything the backend needs, and nothing more.
func TestConformanceAppRoleLeastPrivilege(t *testing.T) {
	v := vaulttest.Start(t)
	ar := approle(t, v)
	var stores []*vaultstore.Store
	keystest.Run(t, func(t *testing.T) keys.Backend {
		s, err := vaultstore.Open(context.Background(), vaultstore.Config{Address: v.Addr, AppRole: ar})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
		return s
	})
	// The same token may not touch anything else.
	s, err := vaultstore.Open(context.Background(), vaultstore.Config{Address: v.Addr, AppRole: ar})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, _ := vault.NewClient(&vault.Config{Address: v.Addr})
	login, err := c.Logical().Write("auth/approle/login", map[string]any{"role_id": ar.RoleID, "secret_id": mustRead(t, ar.SecretIDFile)})
	if err != nil {
		t.Fatal(err)
	}
	c.SetToken(login.Auth.ClientToken)
	// A KEK the policy's token made (through the store).
	if _, err := s.CreateDataKey(context.Background(), "nqn.2026-01.io.nvmegate.test:policy/1", "rec-1"); err != nil {
		t.Fatal(err)
	}
	kekName := kekOf(t, v, "nqn.2026-01.io.nvmegate.test:policy/1")
	for _, op := range []func() error{
		func() error { _, err := c.Logical().Read("secret/data/other/x"); return err },
		func() error { _, err := c.Logical().Write("transit/keys/other", nil); return err },
		func() error { _, err := c.Logical().Delete("secret/metadata/nvmegate/roots/x"); return err },
		func() error { _, err := c.Logical().Write("transit/keys/nvmegate-audit/rotate", nil); return err },
		// Of a KEK's config only deletion_allowed may be set (crypto-erase
		// deletes a KEK whole): never exportable, not even alongside it;
		// trim (destroying old versions piecemeal) is out of reach.
		func() error {
			_, err := c.Logical().Write("nvmegate-kek/keys/"+kekName+"/config", map[string]any{"exportable": true})
			return err
		},
		func() error {
			_, err := c.Logical().Write("nvmegate-kek/keys/"+kekName+"/config", map[string]any{"deletion_allowed": "true", "exportable": true})
			return err
		},
		func() error {
			_, err := c.Logical().Write("nvmegate-kek/keys/"+kekName+"/config", map[string]any{"allow_plaintext_backup": true})
			return err
		},
		func() error {
			_, err := c.Logical().Write("nvmegate-kek/keys/"+kekName+"/trim", map[string]any{"min_available_version": 2})
			return err
		},
		// Deleting a wrapped root's history is not crypto-erase's to do.
		func() error { _, err := c.Logical().Delete("secret/metadata/nvmegate/roots/" + "x"); return err },
		func() error { _, err := c.Logical().Read("nvmegate-kek/export/encryption-key/" + kekName); return err },
		func() error {
			_, err := c.Logical().Write("sys/policies/acl/nvmegate", map[string]any{"policy": ""})
			return err
		},
	} {
		var re *vault.ResponseError
		if err := op(); !errors.As(err, &re) || re.StatusCode != 403 {
			t.Errorf("outside the policy: %v, want 403", err)
		}
	}
}

func mustRead(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Two gateways (two stores, two managers) whose schedules both find the
// same root due, at the same moment, against one Vault: exactly one new
// version, every round.
func TestTwoGatewaysRotateOnce(t *testing.T) {
	v := vaulttest.Start(t)
	ctx := context.Background()
	sub := "nqn.2026-01.io.nvmegate.test:two-gateways"
	clk := &clock{now: time.Now()}
	var ms []*keys.Manager
	for range 2 {
		s := openToken(t, v, nil)
		defer s.Close()
		m, err := keys.NewManager(keys.Options{Backend: s, Now: clk.Now, RotationPeriod: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	if _, err := ms[0].Rotate(ctx, sub, "first"); err != nil {
		t.Fatal(err)
	}
	for round := range 10 {
		for _, m := range ms {
			if err := m.Warm(ctx); err != nil {
				t.Fatal(err)
			}
		}
		clk.Add(time.Hour)
		var wg sync.WaitGroup
		for _, m := range ms {
			wg.Add(1)
			go func() { defer wg.Done(); m.Tick(ctx) }()
		}
		wg.Wait()
		st, err := ms[0].Status(ctx, sub)
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(round + 2); st.Current != want {
			t.Fatalf("round %d: root v%d, want v%d (one rotation per due period)", round, st.Current, want)
		}
	}
	// The check-and-set itself: two writers from the same version.
	roots, err := openToken(t, v, nil).Roots(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	prev := roots[len(roots)-1].Version
	s1, s2 := openToken(t, v, nil), openToken(t, v, nil)
	_, e1 := s1.AddRoot(ctx, sub, prev, bytes.Repeat([]byte{1}, 32), time.Now(), time.Time{})
	_, e2 := s2.AddRoot(ctx, sub, prev, bytes.Repeat([]byte{2}, 32), time.Now(), time.Time{})
	if e1 != nil || !errors.Is(e2, keys.ErrConflict) {
		t.Fatalf("same-version writes: %v, %v; want one success and one ErrConflict", e1, e2)
	}
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// A Vault that stops answering: connects keep being served from the cache
// (no Vault round trip), refreshes fail within the request timeout, then
// past the staleness bound issuance fails closed with a clear error, and
// it recovers by itself when Vault answers again. All logs of the run are
// checked for the secrets issued.
func TestVaultOutageAndSecretHygiene(t *testing.T) {
	v := vaulttest.Start(t)
	ctx := context.Background()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := vaultstore.Open(ctx, vaultstore.Config{Address: v.Addr, Token: v.Token, Timeout: 300 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	clk := &clock{now: time.Now()}
	m, err := keys.NewManager(keys.Options{Backend: s, Now: clk.Now, MaxStaleness: 5 * time.Minute, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	sub := "nqn.2026-01.io.nvmegate.test:outage"
	host := "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	p := keys.CredentialParams{DHCHAPHash: nvmefmt.SHA256, Bidirectional: true, TLSHash: nvmefmt.SHA384}
	var issued []keys.Credentials
	c, err := m.Credentials(ctx, host, sub, p)
	if err != nil {
		t.Fatal(err)
	}
	issued = append(issued, c)
	reads := m.BackendReads()
	for i := range 10000 {
		h := strings.Replace(host, "00000001", strings.Repeat("0", 8-len(hexs(i)))+hexs(i), 1)
		if _, err := m.Credentials(ctx, h, sub, p); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.BackendReads() - reads; got != 0 {
		t.Fatalf("10,000 connects made %d Vault round trips, want 0", got)
	}

	v.Pause()
	resumed := false
	defer func() {
		if !resumed {
			v.Resume()
		}
	}()
	start := time.Now()
	m.Tick(ctx) // the refresh fails (timeout), the cache serves on
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("a refresh against a hung Vault took %v", d)
	}
	clk.Add(4 * time.Minute)
	if c, err = m.Credentials(ctx, host, sub, p); err != nil {
		t.Fatalf("within the staleness bound: %v", err)
	}
	issued = append(issued, c)
	clk.Add(2 * time.Minute)
	_, err = m.Credentials(ctx, host, sub, p)
	if !errors.Is(err, keys.ErrUnavailable) || !strings.Contains(err.Error(), "no credentials are issued") {
		t.Fatalf("past the bound: %v, want ErrUnavailable", err)
	}
	v.Resume()
	resumed = true
	m.Tick(ctx)
	if c, err = m.Credentials(ctx, host, sub, p); err != nil {
		t.Fatalf("after Vault returned: %v", err)
	}
	issued = append(issued, c)
	if _, err := m.Rotate(ctx, sub, "after outage"); err != nil {
		t.Fatal(err)
	}

	out := logs.String()
	if !strings.Contains(out, "refresh failed") {
		t.Fatalf("the outage was not logged:\n%s", out)
	}
	roots, err := s.Roots(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	var secrets []string
	for _, r := range roots {
		secrets = append(secrets, hex.EncodeToString(r.Secret), base64.StdEncoding.EncodeToString(r.Secret), base64.RawURLEncoding.EncodeToString(r.Secret))
	}
	for _, c := range issued {
		for _, s := range []string{c.HostSecret, c.CtrlSecret, c.TLSPSK} {
			secrets = append(secrets, s, strings.Split(s, ":")[2])
			if k, err := nvmefmt.ParseDHCHAP(s); err == nil {
				secrets = append(secrets, hex.EncodeToString(k.Secret))
			}
			if k, err := nvmefmt.ParseTLSPSK(s); err == nil {
				secrets = append(secrets, hex.EncodeToString(k.PSK))
			}
		}
	}
	for _, sec := range secrets {
		if len(sec) >= 16 && strings.Contains(out, sec) {
			t.Fatalf("a secret is in the logs")
		}
	}
}

func hexs(i int) string {
	return strings.ToLower(strings.TrimLeft(hex.EncodeToString([]byte{byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}), "0"))
}

// Certificate auth with the gateway's own X.509-SVID: Vault trusts the
// trust domain's bundle for SPIFFE IDs spiffe://<td>/gateway/*; the
// gateway's SVID logs in (and works under the shipped policy), a node's
// SVID of the same trust domain does not.
func TestCertAuthWithSVID(t *testing.T) {
	v := vaulttest.Start(t, vaulttest.WithTLS())
	ctx := context.Background()
	hcl, err := os.ReadFile(filepath.Join("..", "..", "deploy", "vault", "nvmegate.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Client.Sys().PutPolicyWithContext(ctx, "nvmegate", string(hcl)); err != nil {
		t.Fatal(err)
	}
	if err := v.Client.Sys().EnableAuthWithOptionsWithContext(ctx, "cert", &vault.EnableAuthOptions{Type: "cert"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	now := time.Now()
	ca, err := devca.New(spiffeid.RequireTrustDomainFromString("nvmegate.test"), now)
	if err != nil {
		t.Fatal(err)
	}
	bundlePEM, err := ca.Bundle().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	bundle := string(bundlePEM)
	if err := v.Write(ctx, "auth/cert/certs/nvmegate", map[string]any{
		"certificate": bundle, "allowed_uri_sans": "spiffe://nvmegate.test/gateway/*",
		"token_policies": "nvmegate", "token_ttl": "1h"}); err != nil {
		t.Fatal(err)
	}
	login := func(path string) (*vaultstore.Store, error) {
		svid, err := ca.Issue(spiffeid.RequireFromString("spiffe://nvmegate.test"+path), now.Add(-time.Minute), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := devca.WriteSVID(dir, "svid", svid); err != nil {
			t.Fatal(err)
		}
		cert, key := filepath.Join(dir, "svid.pem"), filepath.Join(dir, "svid.key")
		return vaultstore.Open(ctx, vaultstore.Config{Address: v.Addr, CACert: v.CACert, ClientCert: cert, ClientKey: key, Cert: &vaultstore.CertAuth{}})
	}
	s, err := login("/gateway/nvmegated")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sub := "nqn.2026-01.io.nvmegate.test:cert-auth"
	if _, err := s.AddRoot(ctx, sub, 0, bytes.Repeat([]byte{7}, 32), time.Now(), time.Time{}); err != nil {
		t.Fatalf("gateway SVID under the shipped policy: %v", err)
	}
	// The SVID files rotate; a login made after that presents the new SVID
	// (the old one is gone from disk).
	s2, err := login("/gateway/nvmegated")
	if err != nil {
		t.Fatalf("login after the SVID rotated: %v", err)
	}
	s2.Close()
	if _, err := login("/node/acme-gpu-1"); err == nil {
		t.Fatal("a node's SVID logged in")
	}
}

// kekOf finds the Transit key the store made for a namespace.
func kekOf(t *testing.T, v *vaulttest.Server, ns string) string {
	t.Helper()
	sec, err := v.Client.Logical().List("nvmegate-kek/keys")
	if err != nil || sec == nil {
		t.Fatalf("list KEKs: %v", err)
	}
	for _, k := range sec.Data["keys"].([]any) {
		name := k.(string)
		if strings.HasPrefix(name, "nvmegate-ns-") {
			return name
		}
	}
	t.Fatalf("no KEK for %s", ns)
	return ""
}
