package attest

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	vault "github.com/hashicorp/vault/api"
	"github.com/sigstore/sigstore/pkg/signature/kms/hashivault"
	"github.com/sigstore/sigstore/pkg/signature/options"
)

// VaultConfig names a Vault Transit signing key.
type VaultConfig struct {
	Address     string // Vault address, e.g. https://vault:8200 (VAULT_ADDR if "")
	Token       string // Vault token (VAULT_TOKEN if "")
	TokenFile   string // read at every Refresh instead of Token (Vault Agent rotates it)
	TransitPath string // mount path of the Transit engine; "" means "transit"
	Key         string // the Transit key name (type ed25519 or ecdsa-p256)
}

// VaultSigner signs with a Vault Transit key through sigstore's hashivault
// KMS provider. The private key never leaves Vault.
//
// It pins one key version (the latest when made or refreshed) and asks
// Vault to sign with exactly that version, so that PublicKey names the key
// that made each signature even while the key is rotated in Vault; Refresh
// moves to the new latest version. PublicKeys lists every version's public
// key, because offline verifiers cannot ask Vault.
type VaultSigner struct {
	cfg    VaultConfig
	client *vault.Client

	mu  sync.RWMutex
	sv  *hashivault.SignerVerifier
	pub PublicKey
	all []PublicKey
}

// NewVaultSigner reads the key's versions from Vault and pins the latest.
func NewVaultSigner(ctx context.Context, cfg VaultConfig) (*VaultSigner, error) {
	if cfg.TransitPath == "" {
		cfg.TransitPath = "transit"
	}
	if err := hashivault.ValidReference(hashivault.ReferenceScheme + cfg.Key); err != nil {
		return nil, fmt.Errorf("vault signer: %w", err)
	}
	vc := vault.DefaultConfig()
	if cfg.Address != "" {
		vc.Address = cfg.Address
	}
	client, err := vault.NewClient(vc)
	if err != nil {
		return nil, fmt.Errorf("vault signer: %w", err)
	}
	if cfg.Token != "" {
		client.SetToken(cfg.Token)
	}
	cfg.Address = client.Address()
	s := &VaultSigner{cfg: cfg, client: client}
	if err := s.Refresh(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Refresh re-reads the token file (if any) and the key's versions, and
// pins the latest version. Call it periodically: it picks up a key rotated
// in Vault and a token replaced in its file.
func (s *VaultSigner) Refresh(ctx context.Context) error {
	if s.cfg.TokenFile != "" {
		b, err := os.ReadFile(s.cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("vault signer: token file: %w", err)
		}
		s.client.SetToken(strings.TrimSpace(string(b)))
	}
	all, latest, err := s.readVersions(ctx)
	if err != nil {
		return err
	}
	hf := crypto.SHA256
	if latest.Algorithm == Ed25519 {
		hf = crypto.Hash(0)
	}
	sv, err := hashivault.LoadSignerVerifier(hashivault.ReferenceScheme+s.cfg.Key, hf,
		options.WithContext(ctx),
		options.WithRPCAuthOpts(options.RPCAuth{Address: s.cfg.Address, Token: s.client.Token(), Path: s.cfg.TransitPath}),
		options.WithKeyVersion(strconv.FormatUint(latest.Version, 10)))
	if err != nil {
		return fmt.Errorf("vault signer: %w", err)
	}
	s.mu.Lock()
	s.sv, s.pub, s.all = sv, latest, all
	s.mu.Unlock()
	return nil
}

// readVersions reads transit/keys/<key>: every version's public key.
func (s *VaultSigner) readVersions(ctx context.Context) ([]PublicKey, PublicKey, error) {
	sec, err := s.client.Logical().ReadWithContext(ctx, s.cfg.TransitPath+"/keys/"+s.cfg.Key)
	if err != nil {
		return nil, PublicKey{}, fmt.Errorf("vault signer: read key %s: %w", s.cfg.Key, err)
	}
	if sec == nil || sec.Data == nil {
		return nil, PublicKey{}, fmt.Errorf("vault signer: key %s not found", s.cfg.Key)
	}
	typ, _ := sec.Data["type"].(string)
	latestN, _ := sec.Data["latest_version"].(json.Number)
	latest, err := strconv.ParseUint(string(latestN), 10, 64)
	if err != nil {
		return nil, PublicKey{}, fmt.Errorf("vault signer: key %s: bad latest_version", s.cfg.Key)
	}
	keys, _ := sec.Data["keys"].(map[string]any)
	var all []PublicKey
	var cur PublicKey
	for vs, kv := range keys {
		v, err := strconv.ParseUint(vs, 10, 64)
		if err != nil {
			continue
		}
		m, _ := kv.(map[string]any)
		pubStr, _ := m["public_key"].(string)
		var pk PublicKey
		switch typ {
		case "ed25519":
			raw, err := base64.StdEncoding.DecodeString(pubStr)
			if err != nil || len(raw) != ed25519.PublicKeySize {
				return nil, PublicKey{}, fmt.Errorf("vault signer: key %s v%d: bad ed25519 public key", s.cfg.Key, v)
			}
			pk, err = NewPublicKey(ed25519.PublicKey(raw), v)
			if err != nil {
				return nil, PublicKey{}, err
			}
		case "ecdsa-p256":
			pk, err = ParsePublicKeyPEM([]byte(pubStr), v)
			if err != nil {
				return nil, PublicKey{}, fmt.Errorf("vault signer: key %s v%d: %w", s.cfg.Key, v, err)
			}
		default:
			return nil, PublicKey{}, fmt.Errorf("vault signer: key %s: %w: Transit type %q", s.cfg.Key, ErrUnsupportedKey, typ)
		}
		all = append(all, pk)
		if v == latest {
			cur = pk
		}
	}
	if cur.der == nil {
		return nil, PublicKey{}, fmt.Errorf("vault signer: key %s: latest version %d has no public key", s.cfg.Key, latest)
	}
	slices.SortFunc(all, func(a, b PublicKey) int { return cmp.Compare(a.Version, b.Version) })
	return all, cur, nil
}

// Sign implements Signer with the pinned version. It checks that Vault
// used that version and that the signature verifies under it.
func (s *VaultSigner) Sign(ctx context.Context, msg []byte) ([]byte, error) {
	s.mu.RLock()
	sv, pub := s.sv, s.pub
	s.mu.RUnlock()
	// sigstore's provider does not pass the context to its HTTP call (it
	// has its own timeout and retries): wait for it only as long as ctx
	// allows, so that a hung Vault cannot hold a shutdown.
	type result struct {
		sig  []byte
		used string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		r.sig, r.err = sv.SignMessage(bytes.NewReader(msg), options.WithContext(ctx), options.ReturnKeyVersionUsed(&r.used))
		ch <- r
	}()
	var r result
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("vault signer: sign with %s: %w", s.cfg.Key, ctx.Err())
	case r = <-ch:
	}
	sig, used, err := r.sig, r.used, r.err
	if err != nil {
		return nil, fmt.Errorf("vault signer: sign with %s: %w", s.cfg.Key, err)
	}
	if want := "vault:v" + strconv.FormatUint(pub.Version, 10) + ":"; used != want {
		return nil, fmt.Errorf("vault signer: Vault signed with %q, pinned %q", used, want)
	}
	if err := pub.Verify(msg, sig); err != nil {
		return nil, fmt.Errorf("vault signer: signature from Vault does not verify under %s", pub)
	}
	return sig, nil
}

// PublicKey implements Signer: the pinned version.
func (s *VaultSigner) PublicKey() PublicKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pub
}

// PublicKeys returns every version's public key as of the last Refresh.
func (s *VaultSigner) PublicKeys() []PublicKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.all)
}
