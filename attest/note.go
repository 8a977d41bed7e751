package attest

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/mod/sumdb/note"
)

// C2SP signed-note signature type bytes (c2sp.org/signed-note, "Signature
// types").
const (
	noteAlgEd25519 = 0x01 // Ed25519 over the note text
	noteAlgECDSA   = 0x02 // ECDSA over SHA-256 of the note text, as transparency-dev/witness
)

// NoteKeyHash returns the 32-bit key ID that identifies p in signed notes
// under name:
//
//   - Ed25519: SHA-256(name || 0x0A || 0x01 || 32-byte key)[:4], the
//     standard one (golang.org/x/mod/sumdb/note computes the same).
//   - ECDSA P-256: SHA-256(DER SubjectPublicKeyInfo)[:4], as C2SP
//     signed-note prescribes for type 0x02 ("the truncated SHA-256 hash of
//     the DER encoded public key in SPKI format", the witness and Rekor
//     form). It does not cover the name; the (name, ID) pair still
//     identifies the key, since verifiers match both.
func (p PublicKey) NoteKeyHash(name string) (uint32, error) {
	if !validNoteName(name) {
		return 0, fmt.Errorf("%w: invalid note key name %q", ErrMalformedKey, name)
	}
	var sum [32]byte
	switch p.Algorithm {
	case Ed25519:
		h := sha256.New()
		h.Write([]byte(name))
		h.Write([]byte{'\n', noteAlgEd25519})
		h.Write(p.Key.(ed25519.PublicKey))
		h.Sum(sum[:0])
	case ECDSAP256:
		sum = sha256.Sum256(p.der)
	default:
		return 0, fmt.Errorf("%w: %q", ErrUnsupportedKey, p.Algorithm)
	}
	return binary.BigEndian.Uint32(sum[:4]), nil
}

// VerifierKey returns p as a note verifier key line,
// "<name>+<8 hex digits key ID>+<base64(type byte || key)>", where the key is
// the 32 raw bytes for Ed25519 (the form golang.org/x/mod/sumdb/note and
// every C2SP tool read) and the DER SubjectPublicKeyInfo for ECDSA (the form
// transparency-dev/formats reads).
func (p PublicKey) VerifierKey(name string) (string, error) {
	hash, err := p.NoteKeyHash(name)
	if err != nil {
		return "", err
	}
	var raw []byte
	switch p.Algorithm {
	case Ed25519:
		raw = append([]byte{noteAlgEd25519}, p.Key.(ed25519.PublicKey)...)
	case ECDSAP256:
		raw = append([]byte{noteAlgECDSA}, p.der...)
	}
	return fmt.Sprintf("%s+%08x+%s", name, hash, base64.StdEncoding.EncodeToString(raw)), nil
}

// ParseVerifierKey parses a verifier key line written by VerifierKey (or by
// note.GenerateKey, or by another C2SP tool for types 0x01 and 0x02) and
// returns the key name and the key, of version 0. It checks that the key ID
// matches the key.
func ParseVerifierKey(vkey string) (name string, key PublicKey, err error) {
	name, rest, ok1 := strings.Cut(strings.TrimSpace(vkey), "+")
	hashHex, b64, ok2 := strings.Cut(rest, "+")
	if !ok1 || !ok2 || !validNoteName(name) || len(hashHex) != 8 {
		return "", PublicKey{}, fmt.Errorf("%w: verifier key is not name+hash+key", ErrMalformedKey)
	}
	hash, err := strconv.ParseUint(hashHex, 16, 32)
	if err != nil {
		return "", PublicKey{}, fmt.Errorf("%w: verifier key hash", ErrMalformedKey)
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) < 2 {
		return "", PublicKey{}, fmt.Errorf("%w: verifier key base64", ErrMalformedKey)
	}
	switch raw[0] {
	case noteAlgEd25519:
		if len(raw) != 1+ed25519.PublicKeySize {
			return "", PublicKey{}, fmt.Errorf("%w: ed25519 verifier key of %d bytes", ErrMalformedKey, len(raw)-1)
		}
		key, err = NewPublicKey(ed25519.PublicKey(raw[1:]), 0)
	case noteAlgECDSA:
		var k any
		k, err = x509.ParsePKIXPublicKey(raw[1:])
		if err != nil {
			return "", PublicKey{}, fmt.Errorf("%w: ECDSA verifier key: %v", ErrMalformedKey, err)
		}
		if _, ok := k.(*ecdsa.PublicKey); !ok {
			return "", PublicKey{}, fmt.Errorf("%w: type 0x02 verifier key holds a %T", ErrMalformedKey, k)
		}
		key, err = NewPublicKey(k, 0)
	default:
		return "", PublicKey{}, fmt.Errorf("%w: note signature type 0x%02x", ErrUnsupportedKey, raw[0])
	}
	if err != nil {
		return "", PublicKey{}, err
	}
	if want, _ := key.NoteKeyHash(name); uint64(want) != hash {
		return "", PublicKey{}, fmt.Errorf("%w: verifier key hash %08x does not match the key (%08x)", ErrMalformedKey, hash, want)
	}
	return name, key, nil
}

// NoteVerifier returns a note.Verifier for signatures by p under name.
func (p PublicKey) NoteVerifier(name string) (note.Verifier, error) {
	hash, err := p.NoteKeyHash(name)
	if err != nil {
		return nil, err
	}
	return &noteVerifier{name: name, hash: hash, key: p}, nil
}

type noteVerifier struct {
	name string
	hash uint32
	key  PublicKey
}

func (v *noteVerifier) Name() string    { return v.name }
func (v *noteVerifier) KeyHash() uint32 { return v.hash }
func (v *noteVerifier) Verify(msg, sig []byte) bool {
	return v.key.Verify(msg, sig) == nil
}

// NoteSigner adapts s to note.Signer under name, so that note.Sign makes
// C2SP signed notes with it: Ed25519 keys produce standard type 0x01
// signatures, ECDSA P-256 keys type 0x02. The note API passes no context;
// ctx bounds every Sign made through the adapter, so make one adapter per
// signing operation. The key (and version) is fixed when the adapter is
// made: PublicKey reports what signed.
func NoteSigner(ctx context.Context, s Signer, name string) (*NoteSignerAdapter, error) {
	pub := s.PublicKey()
	hash, err := pub.NoteKeyHash(name)
	if err != nil {
		return nil, err
	}
	return &NoteSignerAdapter{ctx: ctx, s: s, pub: pub, name: name, hash: hash}, nil
}

// NoteSignerAdapter is a note.Signer over a Signer; see NoteSigner.
type NoteSignerAdapter struct {
	ctx  context.Context
	s    Signer
	pub  PublicKey
	name string
	hash uint32
}

// Name implements note.Signer.
func (a *NoteSignerAdapter) Name() string { return a.name }

// KeyHash implements note.Signer.
func (a *NoteSignerAdapter) KeyHash() uint32 { return a.hash }

// PublicKey returns the key version the adapter signs with.
func (a *NoteSignerAdapter) PublicKey() PublicKey { return a.pub }

// Sign implements note.Signer. It refuses to sign if the underlying signer
// has moved to another key since the adapter was made, since the key ID in
// the note would then name the wrong key.
func (a *NoteSignerAdapter) Sign(msg []byte) ([]byte, error) {
	if !a.s.PublicKey().Equal(a.pub) {
		return nil, fmt.Errorf("note signer: key rotated during signing (was %s)", a.pub)
	}
	sig, err := a.s.Sign(a.ctx, msg)
	if err != nil {
		return nil, err
	}
	// Check our own work: a signature that does not verify would make an
	// unverifiable checkpoint.
	if err := a.pub.Verify(msg, sig); err != nil {
		return nil, fmt.Errorf("note signer: signer produced a signature that does not verify under %s", a.pub)
	}
	return sig, nil
}

// validNoteName is the note package's rule for key names: non-empty UTF-8
// with no spaces and no '+'.
func validNoteName(name string) bool {
	return name != "" && utf8.ValidString(name) &&
		strings.IndexFunc(name, unicode.IsSpace) < 0 && !strings.Contains(name, "+")
}

// Public key export files: v<N>.pem (PKIX PEM) and v<N>.vkey (a verifier key
// line), one pair per key version.
var pubFileRe = regexp.MustCompile(`^v([0-9]{1,19})\.(pem|vkey)$`)

// WritePublicKeys writes, for every key, <dir>/v<version>.pem and
// <dir>/v<version>.vkey (the verifier key line under name), mode 0644. The
// directory is created if needed.
func WritePublicKeys(dir, name string, keys []PublicKey) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write public keys: %w", err)
	}
	for _, k := range keys {
		p, err := k.MarshalPEM()
		if err != nil {
			return err
		}
		vk, err := k.VerifierKey(name)
		if err != nil {
			return err
		}
		base := filepath.Join(dir, "v"+strconv.FormatUint(k.Version, 10))
		if err := os.WriteFile(base+".pem", p, 0o644); err != nil {
			return fmt.Errorf("write public keys: %w", err)
		}
		if err := os.WriteFile(base+".vkey", []byte(vk+"\n"), 0o644); err != nil {
			return fmt.Errorf("write public keys: %w", err)
		}
	}
	return nil
}

// LoadPublicKeyFile reads a public key from a PKIX PEM file or a verifier
// key line file. The version is taken from a file name of the form
// v<N>.pem or v<N>.vkey, and is 0 otherwise. The name in a verifier key line
// is not kept: verifiers bind keys to the log's origin.
func LoadPublicKeyFile(path string) (PublicKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return PublicKey{}, fmt.Errorf("load public key: %w", err)
	}
	var version uint64
	if m := pubFileRe.FindStringSubmatch(filepath.Base(path)); m != nil {
		version, _ = strconv.ParseUint(m[1], 10, 64)
	}
	var k PublicKey
	if strings.Contains(string(data), "-----BEGIN") {
		k, err = ParsePublicKeyPEM(data, version)
	} else {
		_, k, err = ParseVerifierKey(string(data))
		k.Version = version
	}
	if err != nil {
		return PublicKey{}, fmt.Errorf("load public key %s: %w", path, err)
	}
	return k, nil
}

// LoadPublicKeyDir loads every v<N>.pem in dir (the layout WritePublicKeys
// writes), ascending by version.
func LoadPublicKeyDir(dir string) ([]PublicKey, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("load public keys: %w", err)
	}
	var out []PublicKey
	for _, e := range ents {
		m := pubFileRe.FindStringSubmatch(e.Name())
		if m == nil || m[2] != "pem" {
			continue
		}
		k, err := LoadPublicKeyFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	sortKeys(out)
	return out, nil
}

func sortKeys(keys []PublicKey) {
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j].Version < keys[j-1].Version; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
}
