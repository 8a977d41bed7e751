package vaultstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	vault "github.com/hashicorp/vault/api"

	"github.com/nvmegate/nvmegate/keys"
)

// Config configures the backend. Address and one way to authenticate are
// required.
type Config struct {
	Address string // e.g. https://vault:8200
	// Authentication: exactly one of Token, TokenFile, AppRole, Cert.
	Token     string
	TokenFile string
	AppRole   *AppRole
	Cert      *CertAuth
	// TLS for the connection (CA bundle; client certificate for Cert).
	CACert     string // PEM file of the CA(s) that sign Vault's certificate
	ClientCert string // PEM file, for Cert auth
	ClientKey  string // PEM file, for Cert auth

	KVMount string // default "secret"
	// TransitMount holds the namespace KEKs and nothing else, so that the
	// policy can grant by single path segment (keys/+, not keys/+/config):
	// default "nvmegate-kek".
	TransitMount string
	Prefix       string        // default "nvmegate"
	Timeout      time.Duration // per request; default 5s
	Logger       *slog.Logger
}

// AppRole logs in with a role ID and a secret ID read from a file.
type AppRole struct {
	Mount        string // default "approle"
	RoleID       string
	SecretIDFile string
}

// CertAuth logs in with the TLS client certificate (the gateway's SVID).
type CertAuth struct {
	Mount string // default "cert"
	Name  string // the cert role to use; "" lets Vault pick by certificate
}

// Store is the Vault keys.Backend.
type Store struct {
	c      *vault.Client
	cfg    Config
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ keys.Backend = (*Store)(nil)

// Open connects and authenticates. For logins (AppRole, Cert) it starts
// renewing the token in the background until Close.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.KVMount, "secret")
	def(&cfg.TransitMount, "nvmegate-kek")
	def(&cfg.Prefix, "nvmegate")
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	n := 0
	for _, set := range []bool{cfg.Token != "", cfg.TokenFile != "", cfg.AppRole != nil, cfg.Cert != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("vaultstore: set exactly one of token, token_file, approle, cert")
	}
	vc := vault.DefaultConfig()
	if cfg.Address != "" {
		vc.Address = cfg.Address
	}
	vc.Timeout = cfg.Timeout
	vc.MaxRetries = 0 // the Manager retries on its own schedule; a hung Vault must not multiply waits
	if cfg.CACert != "" {
		if err := vc.ConfigureTLS(&vault.TLSConfig{CACert: cfg.CACert}); err != nil {
			return nil, fmt.Errorf("vaultstore: tls: %w", err)
		}
	}
	if cfg.ClientCert != "" {
		// The client certificate is the gateway's SVID, which rotates: read
		// the files at every handshake, not once.
		tr, ok := vc.HttpClient.Transport.(*http.Transport)
		if !ok {
			return nil, errors.New("vaultstore: unexpected HTTP transport")
		}
		if tr.TLSClientConfig == nil {
			tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		certFile, keyFile := cfg.ClientCert, cfg.ClientKey
		tr.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("vaultstore: client certificate: %w", err)
			}
			return &c, nil
		}
	}
	c, err := vault.NewClient(vc)
	if err != nil {
		return nil, fmt.Errorf("vaultstore: %w", err)
	}
	c.ClearToken()
	s := &Store{c: c, cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Token != "":
		c.SetToken(cfg.Token)
	case cfg.TokenFile != "":
		tok, err := readToken(cfg.TokenFile)
		if err != nil {
			return nil, err
		}
		c.SetToken(tok)
	}
	rctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	switch {
	case cfg.AppRole != nil || cfg.Cert != nil:
		secret, err := s.login(ctx)
		if err != nil {
			cancel()
			return nil, err
		}
		s.wg.Add(1)
		go s.renew(rctx, secret)
	case cfg.TokenFile != "":
		// Vault Agent (or an operator) replaces the file's token before it
		// expires: pick the new one up.
		s.wg.Add(1)
		go s.watchTokenFile(rctx)
	default:
		// A renewable token is kept alive; a token that is not renewable
		// lives as long as its TTL, which the operator chose.
		if sec, err := s.selfSecret(ctx); err == nil && sec.Auth.Renewable {
			s.wg.Add(1)
			go s.renew(rctx, sec)
		}
	}
	return s, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("vaultstore: token file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// selfSecret describes the current token as a login secret, for the
// LifetimeWatcher.
func (s *Store) selfSecret(ctx context.Context) (*vault.Secret, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sec, err := s.c.Auth().Token().LookupSelfWithContext(ctx)
	if err != nil {
		return nil, classify(err)
	}
	renewable, _ := sec.TokenIsRenewable()
	ttl, _ := sec.TokenTTL()
	return &vault.Secret{Auth: &vault.SecretAuth{ClientToken: s.c.Token(), Renewable: renewable, LeaseDuration: int(ttl.Seconds())}}, nil
}

// watchTokenFile re-reads the token file every 30 seconds.
func (s *Store) watchTokenFile(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tok, err := readToken(s.cfg.TokenFile)
		if err != nil {
			s.log.Warn("vaultstore: token file unreadable; keeping the current token", "err", err)
			continue
		}
		if tok != "" && tok != s.c.Token() {
			s.c.SetToken(tok)
			s.log.Info("vaultstore: token file changed; using the new token")
		}
	}
}

// login authenticates with AppRole or Cert and sets the token.
func (s *Store) login(ctx context.Context) (*vault.Secret, error) {
	var path string
	data := map[string]any{}
	switch {
	case s.cfg.AppRole != nil:
		a := s.cfg.AppRole
		mount := a.Mount
		if mount == "" {
			mount = "approle"
		}
		sid, err := os.ReadFile(a.SecretIDFile)
		if err != nil {
			return nil, fmt.Errorf("vaultstore: approle secret ID: %w", err)
		}
		path = "auth/" + mount + "/login"
		data["role_id"], data["secret_id"] = a.RoleID, strings.TrimSpace(string(sid))
	case s.cfg.Cert != nil:
		mount := s.cfg.Cert.Mount
		if mount == "" {
			mount = "cert"
		}
		path = "auth/" + mount + "/login"
		if s.cfg.Cert.Name != "" {
			data["name"] = s.cfg.Cert.Name
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	secret, err := s.c.Logical().WriteWithContext(ctx, path, data)
	if err != nil {
		return nil, fmt.Errorf("vaultstore: login at %s: %w", path, classify(err))
	}
	if secret == nil || secret.Auth == nil || secret.Auth.ClientToken == "" {
		return nil, fmt.Errorf("vaultstore: login at %s returned no token", path)
	}
	s.c.SetToken(secret.Auth.ClientToken)
	return secret, nil
}

// renew keeps the login token alive with a LifetimeWatcher, and logs in
// again when it can no longer be renewed (max TTL) or renewal fails.
func (s *Store) renew(ctx context.Context, secret *vault.Secret) {
	defer s.wg.Done()
	for {
		if secret.Auth.Renewable {
			w, err := s.c.NewLifetimeWatcher(&vault.LifetimeWatcherInput{Secret: secret})
			if err != nil {
				s.log.Error("vaultstore: token watcher", "err", err)
				return
			}
			go w.Start()
		watch:
			for {
				select {
				case <-ctx.Done():
					w.Stop()
					return
				case err := <-w.DoneCh():
					if err != nil {
						s.log.Warn("vaultstore: token renewal failed; logging in again", "err", err)
					}
					break watch
				case <-w.RenewCh():
				}
			}
			w.Stop()
		} else {
			ttl := time.Duration(secret.Auth.LeaseDuration) * time.Second * 2 / 3
			if ttl <= 0 {
				return // a token without a TTL needs no renewal
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(ttl):
			}
		}
		if s.cfg.AppRole == nil && s.cfg.Cert == nil {
			s.log.Warn("vaultstore: the token can no longer be renewed; it expires at the end of its TTL")
			return
		}
		for {
			var err error
			if secret, err = s.login(ctx); err == nil {
				break
			}
			s.log.Warn("vaultstore: login failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}
}

// Close stops token renewal.
func (s *Store) Close() error {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
	}
	return nil
}

// classify wraps errors of an unreachable or failing Vault in
// keys.ErrUnavailable; others (permission, bad request) pass.
func classify(err error) error {
	var re *vault.ResponseError
	if errors.As(err, &re) {
		if re.StatusCode >= 500 {
			return fmt.Errorf("%w: vault answered %d: %s", keys.ErrUnavailable, re.StatusCode, strings.Join(re.Errors, "; "))
		}
		return fmt.Errorf("vault answered %d: %s", re.StatusCode, strings.Join(re.Errors, "; "))
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: %v", keys.ErrUnavailable, err)
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.Timeout)
}

func enc(name string) string { return base64.RawURLEncoding.EncodeToString([]byte(name)) }

func (s *Store) rootPath(sub string) string { return s.cfg.Prefix + "/roots/" + enc(sub) }
func (s *Store) dekPath(ns string) string   { return s.cfg.Prefix + "/deks/" + enc(ns) }

// kekName is the Transit key of generation gen of a namespace's data key:
// each generation has its own, deleted when the next one takes over.
func (s *Store) kekName(ns string, gen uint64) string {
	h := sha256.Sum256([]byte(ns))
	name := s.cfg.Prefix + "-ns-" + hex.EncodeToString(h[:16])
	if gen > 1 {
		name += "-g" + strconv.FormatUint(gen, 10)
	}
	return name
}

// getJSON reads a KV v2 secret's "json" field into v and returns its KV
// version (0 if absent).
func (s *Store) getJSON(ctx context.Context, path string, v any) (int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sec, err := s.c.KVv2(s.cfg.KVMount).Get(ctx, path)
	if errors.Is(err, vault.ErrSecretNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("vaultstore: read %s: %w", path, classify(err))
	}
	raw, _ := sec.Data["json"].(string)
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return 0, fmt.Errorf("vaultstore: %s: malformed record", path)
	}
	if sec.VersionMetadata == nil {
		return 0, fmt.Errorf("vaultstore: %s: no version metadata", path)
	}
	return sec.VersionMetadata.Version, nil
}

// putJSON writes v with check-and-set on KV version cas (0: only if absent).
func (s *Store) putJSON(ctx context.Context, path string, cas int, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err = s.c.KVv2(s.cfg.KVMount).Put(ctx, path, map[string]any{"json": string(raw)}, vault.WithCheckAndSet(cas))
	var re *vault.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusBadRequest && strings.Contains(strings.Join(re.Errors, " "), "check-and-set") {
		return fmt.Errorf("%w: %s changed concurrently", keys.ErrConflict, path)
	}
	if err != nil {
		return fmt.Errorf("vaultstore: write %s: %w", path, classify(err))
	}
	return nil
}

// Roots implements keys.Backend.
func (s *Store) Roots(ctx context.Context, subsystem string) ([]keys.Root, error) {
	if err := keys.CheckName("subsystem", subsystem); err != nil {
		return nil, err
	}
	var roots []keys.Root
	_, err := s.getJSON(ctx, s.rootPath(subsystem), &roots)
	return roots, err
}

// AddRoot implements keys.Backend with KV v2 check-and-set.
func (s *Store) AddRoot(ctx context.Context, subsystem string, prev uint64, secret []byte, now, dropBefore time.Time) ([]keys.Root, error) {
	if err := keys.CheckName("subsystem", subsystem); err != nil {
		return nil, err
	}
	if len(secret) != keys.RootSize {
		return nil, fmt.Errorf("%w: root must be %d bytes", keys.ErrInvalid, keys.RootSize)
	}
	var roots []keys.Root
	kv, err := s.getJSON(ctx, s.rootPath(subsystem), &roots)
	if err != nil {
		return nil, err
	}
	var cur uint64
	if len(roots) > 0 {
		cur = roots[len(roots)-1].Version
	}
	if cur != prev {
		return nil, fmt.Errorf("%w: %s is at root v%d, not v%d", keys.ErrConflict, subsystem, cur, prev)
	}
	out := keys.NextRoots(roots, secret, now, dropBefore)
	if err := s.putJSON(ctx, s.rootPath(subsystem), kv, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Subsystems implements keys.Backend.
func (s *Store) Subsystems(ctx context.Context) ([]string, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sec, err := s.c.Logical().ListWithContext(ctx, s.cfg.KVMount+"/metadata/"+s.cfg.Prefix+"/roots")
	if err != nil {
		return nil, fmt.Errorf("vaultstore: list roots: %w", classify(err))
	}
	if sec == nil {
		return nil, nil
	}
	ks, _ := sec.Data["keys"].([]any)
	var out []string
	for _, k := range ks {
		ks, _ := k.(string)
		b, err := base64.RawURLEncoding.DecodeString(ks)
		if err == nil {
			out = append(out, string(b))
		}
	}
	return out, nil
}

func (s *Store) write(ctx context.Context, path string, data map[string]any) (*vault.Secret, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sec, err := s.c.Logical().WriteWithContext(ctx, path, data)
	if err != nil {
		return nil, fmt.Errorf("vaultstore: %s: %w", path, classify(err))
	}
	return sec, nil
}

// wrapped reads the ciphertext a Transit datakey or rewrap call returned.
func (s *Store) wrapped(sec *vault.Secret, err error) (keys.Wrapped, error) {
	if err != nil {
		return keys.Wrapped{}, err
	}
	ct, _ := sec.Data["ciphertext"].(string)
	v, err := kekVersionOf(ct)
	if err != nil {
		return keys.Wrapped{}, err
	}
	return keys.Wrapped{KEKVersion: v, Ciphertext: ct}, nil
}

// kekVersionOf reads the version of a Transit ciphertext "vault:v<N>:…".
func kekVersionOf(ct string) (uint64, error) {
	rest, ok := strings.CutPrefix(ct, "vault:v")
	vs, _, ok2 := strings.Cut(rest, ":")
	v, err := strconv.ParseUint(vs, 10, 64)
	if !ok || !ok2 || err != nil {
		return 0, fmt.Errorf("%w: not a Transit ciphertext", keys.ErrInvalid)
	}
	return v, nil
}

// CreateDataKey implements keys.Backend.
func (s *Store) CreateDataKey(ctx context.Context, namespace, owner string) (keys.Wrapped, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return keys.Wrapped{}, err
	}
	var existing keys.DataKeyRecord
	if kv, err := s.getJSON(ctx, s.dekPath(namespace), &existing); err != nil {
		return keys.Wrapped{}, err
	} else if kv != 0 {
		return keys.Wrapped{}, fmt.Errorf("%w: %s already has a data key", keys.ErrConflict, namespace)
	}
	w, err := s.newDataKey(ctx, namespace, 1)
	if err != nil {
		return keys.Wrapped{}, err
	}
	return w, s.putJSON(ctx, s.dekPath(namespace), 0, keys.DataKeyRecord{Wrapped: w, Owner: owner})
}

// newDataKey makes a data key of generation gen under that generation's
// Transit key (created if needed: creating an existing key changes
// nothing).
func (s *Store) newDataKey(ctx context.Context, namespace string, gen uint64) (keys.Wrapped, error) {
	name := s.kekName(namespace, gen)
	if _, err := s.write(ctx, s.cfg.TransitMount+"/keys/"+name, map[string]any{"type": "aes256-gcm96"}); err != nil {
		return keys.Wrapped{}, err
	}
	w, err := s.wrapped(s.write(ctx, s.cfg.TransitMount+"/datakey/wrapped/"+name, map[string]any{"bits": 256}))
	w.Generation = gen
	return w, err
}

// record reads a namespace's data key record and its KV version;
// ErrNotFound without one.
func (s *Store) record(ctx context.Context, namespace string) (keys.DataKeyRecord, int, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return keys.DataKeyRecord{}, 0, err
	}
	var rec keys.DataKeyRecord
	kv, err := s.getJSON(ctx, s.dekPath(namespace), &rec)
	if err == nil && kv == 0 {
		err = fmt.Errorf("%w: %s has no data key", keys.ErrNotFound, namespace)
	}
	return rec, kv, err
}

// BeginDataKeyRotation implements keys.Backend.
func (s *Store) BeginDataKeyRotation(ctx context.Context, namespace string) (keys.Wrapped, error) {
	rec, kv, err := s.record(ctx, namespace)
	if err != nil {
		return keys.Wrapped{}, err
	}
	if rec.Next != nil {
		return *rec.Next, nil
	}
	w, err := s.newDataKey(ctx, namespace, rec.Gen()+1)
	if err != nil {
		return keys.Wrapped{}, err
	}
	rec.Next = &w
	return w, s.putJSON(ctx, s.dekPath(namespace), kv, rec)
}

// CommitDataKeyRotation implements keys.Backend: the record moves to the
// next generation (check-and-set), then the previous generation's
// Transit key is deleted.
func (s *Store) CommitDataKeyRotation(ctx context.Context, namespace string, gen uint64) (keys.Wrapped, error) {
	rec, kv, err := s.record(ctx, namespace)
	if err != nil {
		return keys.Wrapped{}, err
	}
	switch {
	case rec.Next != nil && rec.Next.Gen() == gen:
		rec.Wrapped, rec.Next = *rec.Next, nil
		if err := s.putJSON(ctx, s.dekPath(namespace), kv, rec); err != nil {
			return keys.Wrapped{}, err
		}
	case rec.Next == nil && rec.Gen() == gen:
	default:
		return keys.Wrapped{}, fmt.Errorf("%w: %s's data key is generation %d, with no generation %d under way", keys.ErrConflict, namespace, rec.Gen(), gen)
	}
	if gen > 1 {
		if err := s.destroyKEK(ctx, s.kekName(namespace, gen-1)); err != nil {
			return keys.Wrapped{}, err
		}
	}
	return rec.Wrapped, nil
}

// destroyKEK deletes a Transit key, if it exists: every version, so that
// nothing it wrapped unwraps again.
func (s *Store) destroyKEK(ctx context.Context, name string) error {
	vs, err := s.kekVersions(ctx, name)
	if err != nil || len(vs) == 0 {
		return err
	}
	// "true" as a string: the policy allows exactly this value.
	if _, err := s.write(ctx, s.cfg.TransitMount+"/keys/"+name+"/config", map[string]any{"deletion_allowed": "true"}); err != nil {
		return err
	}
	return s.delete(ctx, s.cfg.TransitMount+"/keys/"+name)
}

// DataKey implements keys.Backend.
func (s *Store) DataKey(ctx context.Context, namespace string) (keys.DataKeyRecord, error) {
	rec, _, err := s.record(ctx, namespace)
	return rec, err
}

// Unwrap implements keys.Backend with transit/decrypt.
func (s *Store) Unwrap(ctx context.Context, namespace string, w keys.Wrapped) ([]byte, error) {
	sec, err := s.write(ctx, s.cfg.TransitMount+"/decrypt/"+s.kekName(namespace, w.Gen()), map[string]any{"ciphertext": w.Ciphertext})
	if err != nil {
		if strings.Contains(err.Error(), "key not found") {
			// The generation's KEK is gone (committed past, or erased).
			return nil, fmt.Errorf("%w: %s has no KEK of generation %d", keys.ErrNotFound, namespace, w.Gen())
		}
		return nil, err
	}
	p, _ := sec.Data["plaintext"].(string)
	dek, err := base64.StdEncoding.DecodeString(p)
	if err != nil || len(dek) != 32 {
		return nil, fmt.Errorf("vaultstore: %s: decrypt returned no 256-bit key", namespace)
	}
	return dek, nil
}

// RotateDataKey implements keys.Backend: rotate the Transit key, rewrap,
// store with check-and-set.
func (s *Store) RotateDataKey(ctx context.Context, namespace string) (keys.Wrapped, error) {
	rec, kv, err := s.record(ctx, namespace)
	if err != nil {
		return keys.Wrapped{}, err
	}
	name := s.kekName(namespace, rec.Gen())
	if _, err := s.write(ctx, s.cfg.TransitMount+"/keys/"+name+"/rotate", nil); err != nil {
		return keys.Wrapped{}, err
	}
	w, err := s.wrapped(s.write(ctx, s.cfg.TransitMount+"/rewrap/"+name, map[string]any{"ciphertext": rec.Ciphertext}))
	if err != nil {
		return keys.Wrapped{}, err
	}
	w.Generation = rec.Generation
	rec.Wrapped = w
	return w, s.putJSON(ctx, s.dekPath(namespace), kv, rec)
}

// DestroyDataKey implements keys.Backend: the namespace's Transit KEK is
// deleted (every version: whatever it wrapped, in KV history or a backup,
// can no longer be unwrapped), then the wrapped key's KV history. The
// gateway's policy lets it set deletion_allowed and nothing else on a KEK's
// config (deploy/vault/nvmegate.hcl).
func (s *Store) DestroyDataKey(ctx context.Context, namespace string) error {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return err
	}
	var rec keys.DataKeyRecord
	kv, err := s.getJSON(ctx, s.dekPath(namespace), &rec)
	if err != nil {
		return err
	}
	// Every generation's key: the current, a next one under way, and an
	// old one a commit did not get to delete.
	gen := rec.Gen()
	names := []string{s.kekName(namespace, gen), s.kekName(namespace, gen+1)}
	if gen > 1 {
		names = append(names, s.kekName(namespace, gen-1))
	}
	found := kv != 0
	for _, name := range names {
		vs, err := s.kekVersions(ctx, name)
		if err != nil {
			return err
		}
		if len(vs) == 0 {
			continue
		}
		found = true
		if err := s.destroyKEK(ctx, name); err != nil {
			return err
		}
	}
	if !found {
		return fmt.Errorf("%w: %s has no data key", keys.ErrNotFound, namespace)
	}
	return s.delete(ctx, s.cfg.KVMount+"/metadata/"+s.dekPath(namespace))
}

func (s *Store) delete(ctx context.Context, path string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.c.Logical().DeleteWithContext(ctx, path); err != nil {
		return fmt.Errorf("vaultstore: delete %s: %w", path, classify(err))
	}
	return nil
}

// KEKVersions implements keys.Backend from transit/keys/<name>.
// The current generation's key is read from the data key's record.
func (s *Store) KEKVersions(ctx context.Context, namespace string) ([]keys.KEKVersion, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return nil, err
	}
	var rec keys.DataKeyRecord
	if _, err := s.getJSON(ctx, s.dekPath(namespace), &rec); err != nil {
		return nil, err
	}
	return s.kekVersions(ctx, s.kekName(namespace, rec.Gen()))
}

// kekVersions lists a Transit key's versions; none if it does not exist.
func (s *Store) kekVersions(ctx context.Context, name string) ([]keys.KEKVersion, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	sec, err := s.c.Logical().ReadWithContext(ctx, s.cfg.TransitMount+"/keys/"+name)
	if err != nil {
		return nil, fmt.Errorf("vaultstore: read KEK: %w", classify(err))
	}
	if sec == nil {
		return nil, nil
	}
	m, _ := sec.Data["keys"].(map[string]any)
	var out []keys.KEKVersion
	for vs, created := range m {
		v, err := strconv.ParseUint(vs, 10, 64)
		if err != nil {
			continue
		}
		kv := keys.KEKVersion{Version: v}
		if n, ok := created.(json.Number); ok {
			if secs, err := n.Int64(); err == nil {
				kv.Created = time.Unix(secs, 0).UTC()
			}
		}
		out = append(out, kv)
	}
	slices.SortFunc(out, func(a, b keys.KEKVersion) int { return cmp.Compare(a.Version, b.Version) })
	return out, nil
}
