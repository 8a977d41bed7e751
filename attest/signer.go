package attest

import (
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"

	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/options"
)

// Signer signs messages with one version of a signing key. Implementations
// are safe for concurrent use.
//
// Sign returns a pure Ed25519 signature over msg, or an ECDSA P-256 ASN.1
// DER signature over SHA-256(msg), as PublicKey().Algorithm says; PublicKey
// returns the key (and version) that verifies it. A signer whose key can be
// rotated underneath it (Vault) pins the version it reports, so that the
// version recorded with a signature is the one that made it.
type Signer interface {
	Sign(ctx context.Context, msg []byte) ([]byte, error)
	PublicKey() PublicKey
}

// LocalSigner signs with a private key held in memory, through sigstore's
// signature package.
type LocalSigner struct {
	sv  signature.Signer
	pub PublicKey
}

// NewLocalSigner returns a signer for key (ed25519.PrivateKey or
// *ecdsa.PrivateKey on P-256) reporting the given version.
func NewLocalSigner(key crypto.Signer, version uint64) (*LocalSigner, error) {
	var sv signature.Signer
	var err error
	switch k := key.(type) {
	case ed25519.PrivateKey:
		sv, err = signature.LoadED25519Signer(k)
	case *ed25519.PrivateKey:
		sv, err = signature.LoadED25519Signer(*k)
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: ECDSA on %s (only P-256)", ErrUnsupportedKey, k.Curve.Params().Name)
		}
		sv, err = signature.LoadECDSASigner(k, crypto.SHA256)
	default:
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedKey, key)
	}
	if err != nil {
		return nil, fmt.Errorf("load signer: %w", err)
	}
	pub, err := NewPublicKey(key.Public(), version)
	if err != nil {
		return nil, err
	}
	return &LocalSigner{sv: sv, pub: pub}, nil
}

// Sign implements Signer.
func (s *LocalSigner) Sign(ctx context.Context, msg []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sig, err := s.sv.SignMessage(bytes.NewReader(msg), options.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("sign with %s: %w", s.pub, err)
	}
	return sig, nil
}

// PublicKey implements Signer.
func (s *LocalSigner) PublicKey() PublicKey { return s.pub }

// GenerateKey returns a new private key of the algorithm (Ed25519 if alg is
// ""). rand is used for Ed25519 only when it is not nil (tests pass a fixed
// reader for reproducible keys); ECDSA keys always use crypto/rand.
func GenerateKey(alg Algorithm, random io.Reader) (crypto.Signer, error) {
	switch alg {
	case "", Ed25519:
		if random == nil {
			random = rand.Reader
		}
		seed := make([]byte, ed25519.SeedSize)
		if _, err := io.ReadFull(random, seed); err != nil {
			return nil, fmt.Errorf("generate ed25519 key: %w", err)
		}
		return ed25519.NewKeyFromSeed(seed), nil
	case ECDSAP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return nil, fmt.Errorf("%w: %q", ErrUnsupportedKey, alg)
	}
}

// WriteKeyFile writes key as an unencrypted PKCS#8 "PRIVATE KEY" PEM file,
// mode 0600, refusing to overwrite an existing file. The file is fsync'd and
// renamed into place, so a crash leaves either no file or a whole one.
func WriteKeyFile(path string, key crypto.Signer) error {
	data, err := cryptoutils.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return fmt.Errorf("write key file %s: %w", path, ErrUnsupportedKey)
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("write key file %s: %w", path, fs.ErrExist)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".key-*")
	if err != nil {
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	// Link fails if path appeared meanwhile; rename would replace it.
	if err := os.Link(tmp.Name(), path); err != nil {
		return fmt.Errorf("write key file %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

// LoadKeyFile reads a PKCS#8 (or SEC 1 EC) private key PEM file and returns a
// signer reporting version. It refuses files that group or others may
// access (ErrKeyFilePermissions).
func LoadKeyFile(path string, version uint64) (*LocalSigner, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("load key file %s (mode %04o): %w", path, fi.Mode().Perm(), ErrKeyFilePermissions)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load key file: %w", err)
	}
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(data, nil)
	clear(data)
	if err != nil {
		// The parser's message says what was wrong with the structure,
		// never the key bytes.
		return nil, fmt.Errorf("load key file %s: %w: %v", path, ErrMalformedKey, err)
	}
	cs, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("load key file %s: %w: %T", path, ErrUnsupportedKey, priv)
	}
	s, err := NewLocalSigner(cs, version)
	if err != nil {
		return nil, fmt.Errorf("load key file %s: %w", path, err)
	}
	return s, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// keyFileRe matches the key files of a KeyDir: v<version>.key.
var keyFileRe = regexp.MustCompile(`^v([1-9][0-9]{0,18})\.key$`)

// KeyDir is a directory of versioned local signing keys, one PKCS#8 PEM file
// per version named v<N>.key (mode 0600, directory 0700). The highest
// version signs; the older ones stay so that their public keys can still be
// exported for signatures they made. Rotate adds a version.
type KeyDir struct {
	dir string
	alg Algorithm

	mu      sync.RWMutex
	signers []*LocalSigner // ascending versions
}

// OpenKeyDir loads every key version in dir. If the directory holds no key
// and create is true, it is created (0700) with version 1 of algorithm alg
// (Ed25519 if ""); with create false that is ErrNoKeys.
func OpenKeyDir(dir string, alg Algorithm, create bool) (*KeyDir, error) {
	if alg == "" {
		alg = Ed25519
	}
	if alg != Ed25519 && alg != ECDSAP256 {
		return nil, fmt.Errorf("open key dir %s: %w: %q", dir, ErrUnsupportedKey, alg)
	}
	d := &KeyDir{dir: dir, alg: alg}
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist) && create:
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open key dir: %w", err)
		}
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("open key dir %s: %w", dir, ErrNoKeys)
	case err != nil:
		return nil, fmt.Errorf("open key dir: %w", err)
	}
	for _, e := range ents {
		m := keyFileRe.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("open key dir %s: %w: %s", dir, ErrMalformedKey, e.Name())
		}
		s, err := LoadKeyFile(filepath.Join(dir, e.Name()), v)
		if err != nil {
			return nil, fmt.Errorf("open key dir: %w", err)
		}
		d.signers = append(d.signers, s)
	}
	slices.SortFunc(d.signers, func(a, b *LocalSigner) int {
		return cmp.Compare(a.pub.Version, b.pub.Version)
	})
	if len(d.signers) == 0 {
		if !create {
			return nil, fmt.Errorf("open key dir %s: %w", dir, ErrNoKeys)
		}
		if _, err := d.Rotate(nil); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Rotate generates the next key version (with rand for Ed25519, see
// GenerateKey), writes it and makes it current.
func (d *KeyDir) Rotate(random io.Reader) (*LocalSigner, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := uint64(1)
	if n := len(d.signers); n > 0 {
		next = d.signers[n-1].pub.Version + 1
	}
	key, err := GenerateKey(d.alg, random)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(d.dir, "v"+strconv.FormatUint(next, 10)+".key")
	if err := WriteKeyFile(path, key); err != nil {
		return nil, fmt.Errorf("rotate: %w", err)
	}
	s, err := NewLocalSigner(key, next)
	if err != nil {
		return nil, err
	}
	d.signers = append(d.signers, s)
	return s, nil
}

// Current returns the signer of the highest version.
func (d *KeyDir) Current() *LocalSigner {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.signers[len(d.signers)-1]
}

// Sign implements Signer with the current version.
func (d *KeyDir) Sign(ctx context.Context, msg []byte) ([]byte, error) {
	return d.Current().Sign(ctx, msg)
}

// PublicKey implements Signer: the current version's key. Sign and
// PublicKey may straddle a Rotate; callers that record the version with a
// signature take a signer with Current and use it for both.
func (d *KeyDir) PublicKey() PublicKey { return d.Current().PublicKey() }

// PublicKeys returns the public keys of every version, ascending.
func (d *KeyDir) PublicKeys() []PublicKey {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]PublicKey, len(d.signers))
	for i, s := range d.signers {
		out[i] = s.pub
	}
	return out
}
