package localstore

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate/keys"
)

var (
	bucketRoots = []byte("roots")
	bucketKEKs  = []byte("keks")
	bucketDEKs  = []byte("deks")
)

// ErrKeyFile is returned by Open for a key file that is unusable: the wrong
// size, or readable by others.
var ErrKeyFile = errors.New("localstore: bad key file")

// Store is the local keys.Backend.
type Store struct {
	db   *bolt.DB
	aead cipher.AEAD
	now  func() time.Time
}

var _ keys.Backend = (*Store)(nil)

// Open opens (creating if needed) the store at path, sealed under keyFile
// (created with a new random key, 0600, if absent).
func Open(path, keyFile string) (*Store, error) {
	key, err := loadKey(keyFile)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("localstore: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRoots, bucketKEKs, bucketDEKs} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("localstore: %w", err)
	}
	return &Store{db: db, aead: aead, now: time.Now}, nil
}

// loadKey reads the 32-byte key, or creates it. The file is opened once
// without following symlinks, and its mode checked on that descriptor: a
// key file others can read is refused, as it would expose every key in the
// store.
func loadKey(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return createKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("localstore: key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("localstore: key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrKeyFile, path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v; it must not be readable by group or others (chmod 600)", ErrKeyFile, path, fi.Mode().Perm())
	}
	key := make([]byte, 33)
	n, err := io.ReadFull(f, key)
	if n != 32 || !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("%w: %s must hold exactly 32 bytes", ErrKeyFile, path)
	}
	return key[:32], nil
}

// createKey writes a new random key to a temporary file and links it into
// place, so that a crash never leaves a short key file behind and two
// processes never both create one (the link fails if the name exists).
func createKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(dir, ".keyfile-*")
	if err != nil {
		return nil, fmt.Errorf("localstore: create key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, err
	}
	if _, err := tmp.Write(key); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadKey(path) // another process made it first
		}
		return nil, fmt.Errorf("localstore: create key file: %w", err)
	}
	return key, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func aad(bucket, name []byte) []byte {
	return append(append(append([]byte{}, bucket...), 0), name...)
}

func (s *Store) seal(bucket, name []byte, v any) ([]byte, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, plain, aad(bucket, name)), nil
}

func (s *Store) open(bucket, name, sealed []byte, v any) error {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return fmt.Errorf("localstore: %s/%s: sealed value too short", bucket, name)
	}
	plain, err := s.aead.Open(nil, sealed[:n], sealed[n:], aad(bucket, name))
	if err != nil {
		// The wrong key file, or a value changed on disk.
		return fmt.Errorf("localstore: %s/%s does not unseal with this key file", bucket, name)
	}
	return json.Unmarshal(plain, v)
}

func (s *Store) get(tx *bolt.Tx, bucket []byte, name string, v any) (bool, error) {
	raw := tx.Bucket(bucket).Get([]byte(name))
	if raw == nil {
		return false, nil
	}
	return true, s.open(bucket, []byte(name), raw, v)
}

func (s *Store) put(tx *bolt.Tx, bucket []byte, name string, v any) error {
	sealed, err := s.seal(bucket, []byte(name), v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(name), sealed)
}

// Roots implements keys.Backend.
func (s *Store) Roots(ctx context.Context, subsystem string) ([]keys.Root, error) {
	if err := keys.CheckName("subsystem", subsystem); err != nil {
		return nil, err
	}
	var roots []keys.Root
	err := s.db.View(func(tx *bolt.Tx) error {
		_, err := s.get(tx, bucketRoots, subsystem, &roots)
		return err
	})
	return roots, err
}

// AddRoot implements keys.Backend: the check and the write are one bbolt
// transaction.
func (s *Store) AddRoot(ctx context.Context, subsystem string, prev uint64, secret []byte, now, dropBefore time.Time) ([]keys.Root, error) {
	if err := keys.CheckName("subsystem", subsystem); err != nil {
		return nil, err
	}
	if len(secret) != keys.RootSize {
		return nil, fmt.Errorf("%w: root must be %d bytes", keys.ErrInvalid, keys.RootSize)
	}
	var out []keys.Root
	err := s.db.Update(func(tx *bolt.Tx) error {
		var roots []keys.Root
		if _, err := s.get(tx, bucketRoots, subsystem, &roots); err != nil {
			return err
		}
		var cur uint64
		if len(roots) > 0 {
			cur = roots[len(roots)-1].Version
		}
		if cur != prev {
			return fmt.Errorf("%w: %s is at root v%d, not v%d", keys.ErrConflict, subsystem, cur, prev)
		}
		out = keys.NextRoots(roots, secret, now, dropBefore)
		return s.put(tx, bucketRoots, subsystem, out)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Subsystems implements keys.Backend.
func (s *Store) Subsystems(ctx context.Context) ([]string, error) {
	var out []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRoots).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// kek is one version of a namespace's key-encryption key.
type kek struct {
	Version uint64    `json:"version"`
	Key     []byte    `json:"key"`
	Created time.Time `json:"created"`
}

// Ciphertexts are "local:v<KEK version>:<base64(nonce || sealed DEK)>",
// sealed with the KEK and the namespace as associated data.
func (s *Store) wrap(namespace string, k kek, dek []byte) (keys.Wrapped, error) {
	aead, err := gcm(k.Key)
	if err != nil {
		return keys.Wrapped{}, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return keys.Wrapped{}, err
	}
	ct := aead.Seal(nonce, nonce, dek, []byte(namespace))
	return keys.Wrapped{KEKVersion: k.Version, Ciphertext: "local:v" + strconv.FormatUint(k.Version, 10) + ":" + base64.StdEncoding.EncodeToString(ct)}, nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func (s *Store) unwrap(namespace string, keks []kek, w keys.Wrapped) ([]byte, error) {
	rest, ok := strings.CutPrefix(w.Ciphertext, "local:v")
	if !ok {
		return nil, fmt.Errorf("%w: not a local ciphertext", keys.ErrInvalid)
	}
	vs, b64, ok := strings.Cut(rest, ":")
	v, err := strconv.ParseUint(vs, 10, 64)
	if !ok || err != nil {
		return nil, fmt.Errorf("%w: malformed local ciphertext", keys.ErrInvalid)
	}
	ct, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("%w: malformed local ciphertext", keys.ErrInvalid)
	}
	for _, k := range keks {
		if k.Version != v {
			continue
		}
		aead, err := gcm(k.Key)
		if err != nil {
			return nil, err
		}
		if len(ct) < aead.NonceSize() {
			return nil, fmt.Errorf("%w: malformed local ciphertext", keys.ErrInvalid)
		}
		dek, err := aead.Open(nil, ct[:aead.NonceSize()], ct[aead.NonceSize():], []byte(namespace))
		if err != nil {
			return nil, fmt.Errorf("%w: data key of %s does not unwrap with KEK v%d", keys.ErrInvalid, namespace, v)
		}
		return dek, nil
	}
	return nil, fmt.Errorf("%w: %s has no KEK v%d", keys.ErrNotFound, namespace, v)
}

func newKEK(version uint64, now time.Time) (kek, error) {
	k := kek{Version: version, Key: make([]byte, 32), Created: now}
	_, err := rand.Read(k.Key)
	return k, err
}

// CreateDataKey implements keys.Backend.
func (s *Store) CreateDataKey(ctx context.Context, namespace, owner string) (keys.Wrapped, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return keys.Wrapped{}, err
	}
	var w keys.Wrapped
	err := s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketDEKs).Get([]byte(namespace)) != nil {
			return fmt.Errorf("%w: %s already has a data key", keys.ErrConflict, namespace)
		}
		var err error
		if w, err = s.newDataKey(tx, namespace, 1, false); err != nil {
			return err
		}
		return s.put(tx, bucketDEKs, namespace, keys.DataKeyRecord{Wrapped: w, Owner: owner})
	})
	return w, err
}

// kekKey is where generation gen of a namespace's KEK is kept: the first
// under the namespace's name, the next ones beside it.
func kekKey(namespace string, gen uint64) string {
	if gen <= 1 {
		return namespace
	}
	return namespace + "#g" + strconv.FormatUint(gen, 10)
}

// newDataKey makes a data key of generation gen wrapped by that
// generation's KEK: the KEK is made if there is none, or, with fresh, made
// anew in any case.
func (s *Store) newDataKey(tx *bolt.Tx, namespace string, gen uint64, fresh bool) (keys.Wrapped, error) {
	var keks []kek
	if !fresh {
		if _, err := s.get(tx, bucketKEKs, kekKey(namespace, gen), &keks); err != nil {
			return keys.Wrapped{}, err
		}
	}
	if len(keks) == 0 {
		k, err := newKEK(1, s.now())
		if err != nil {
			return keys.Wrapped{}, err
		}
		keks = []kek{k}
		if err := s.put(tx, bucketKEKs, kekKey(namespace, gen), keks); err != nil {
			return keys.Wrapped{}, err
		}
	}
	dek := make([]byte, 32)
	if _, err := rand.Read(dek); err != nil {
		return keys.Wrapped{}, err
	}
	defer clear(dek)
	w, err := s.wrap(namespace, keks[len(keks)-1], dek)
	w.Generation = gen
	return w, err
}

func (s *Store) record(tx *bolt.Tx, namespace string) (keys.DataKeyRecord, error) {
	var rec keys.DataKeyRecord
	ok, err := s.get(tx, bucketDEKs, namespace, &rec)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s has no data key", keys.ErrNotFound, namespace)
	}
	return rec, err
}

// BeginDataKeyRotation implements keys.Backend.
func (s *Store) BeginDataKeyRotation(ctx context.Context, namespace string) (keys.Wrapped, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return keys.Wrapped{}, err
	}
	var w keys.Wrapped
	err := s.db.Update(func(tx *bolt.Tx) error {
		rec, err := s.record(tx, namespace)
		if err != nil {
			return err
		}
		if rec.Next != nil {
			w = *rec.Next
			return nil
		}
		if w, err = s.newDataKey(tx, namespace, rec.Gen()+1, true); err != nil {
			return err
		}
		rec.Next = &w
		return s.put(tx, bucketDEKs, namespace, rec)
	})
	return w, err
}

// CommitDataKeyRotation implements keys.Backend.
func (s *Store) CommitDataKeyRotation(ctx context.Context, namespace string, gen uint64) (keys.Wrapped, error) {
	var w keys.Wrapped
	err := s.db.Update(func(tx *bolt.Tx) error {
		rec, err := s.record(tx, namespace)
		if err != nil {
			return err
		}
		switch {
		case rec.Next != nil && rec.Next.Gen() == gen:
			rec.Wrapped, rec.Next = *rec.Next, nil
			if err := s.put(tx, bucketDEKs, namespace, rec); err != nil {
				return err
			}
		case rec.Next == nil && rec.Gen() == gen:
		default:
			return fmt.Errorf("%w: %s's data key is generation %d, with no generation %d under way", keys.ErrConflict, namespace, rec.Gen(), gen)
		}
		w = rec.Wrapped
		if gen > 1 {
			return tx.Bucket(bucketKEKs).Delete([]byte(kekKey(namespace, gen-1)))
		}
		return nil
	})
	return w, err
}

// DataKey implements keys.Backend.
func (s *Store) DataKey(ctx context.Context, namespace string) (keys.DataKeyRecord, error) {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return keys.DataKeyRecord{}, err
	}
	var rec keys.DataKeyRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		rec, err = s.record(tx, namespace)
		return err
	})
	return rec, err
}

// Unwrap implements keys.Backend.
func (s *Store) Unwrap(ctx context.Context, namespace string, w keys.Wrapped) ([]byte, error) {
	var keks []kek
	err := s.db.View(func(tx *bolt.Tx) error {
		_, err := s.get(tx, bucketKEKs, kekKey(namespace, w.Gen()), &keks)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.unwrap(namespace, keks, w)
}

// RotateDataKey implements keys.Backend.
func (s *Store) RotateDataKey(ctx context.Context, namespace string) (keys.Wrapped, error) {
	var w keys.Wrapped
	err := s.db.Update(func(tx *bolt.Tx) error {
		rec, err := s.record(tx, namespace)
		if err != nil {
			return err
		}
		kk := kekKey(namespace, rec.Gen())
		var keks []kek
		if _, err := s.get(tx, bucketKEKs, kk, &keks); err != nil {
			return err
		}
		if len(keks) == 0 {
			return fmt.Errorf("%w: %s has no KEK", keys.ErrNotFound, namespace)
		}
		dek, err := s.unwrap(namespace, keks, rec.Wrapped)
		if err != nil {
			return err
		}
		defer clear(dek)
		k, err := newKEK(keks[len(keks)-1].Version+1, s.now())
		if err != nil {
			return err
		}
		keks = append(keks, k)
		if err := s.put(tx, bucketKEKs, kk, keks); err != nil {
			return err
		}
		if w, err = s.wrap(namespace, k, dek); err != nil {
			return err
		}
		w.Generation = rec.Generation
		rec.Wrapped = w
		return s.put(tx, bucketDEKs, namespace, rec)
	})
	return w, err
}

// DestroyDataKey implements keys.Backend: the wrapped data key and the
// KEK versions leave the database in one transaction. bbolt may keep the
// freed pages (sealed under the key file) until it reuses them; the Vault
// backend, which deletes the KEK in Transit, is the one to rely on.
func (s *Store) DestroyDataKey(ctx context.Context, namespace string) error {
	if err := keys.CheckName("namespace", namespace); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		d, k := tx.Bucket(bucketDEKs), tx.Bucket(bucketKEKs)
		if d.Get([]byte(namespace)) == nil && k.Get([]byte(namespace)) == nil {
			return fmt.Errorf("%w: %s has no data key", keys.ErrNotFound, namespace)
		}
		if err := d.Delete([]byte(namespace)); err != nil {
			return err
		}
		// Every generation's KEK: the current, a next one under way, and
		// an old one a commit did not get to destroy.
		var gens [][]byte
		c := k.Cursor()
		prefix := []byte(kekKey(namespace, 2)[:len(namespace)+2])
		for key, _ := c.Seek(prefix); key != nil && bytes.HasPrefix(key, prefix); key, _ = c.Next() {
			gens = append(gens, bytes.Clone(key))
		}
		for _, g := range gens {
			if err := k.Delete(g); err != nil {
				return err
			}
		}
		return k.Delete([]byte(namespace))
	})
}

// KEKVersions implements keys.Backend.
func (s *Store) KEKVersions(ctx context.Context, namespace string) ([]keys.KEKVersion, error) {
	var keks []kek
	err := s.db.View(func(tx *bolt.Tx) error {
		var rec keys.DataKeyRecord
		if _, err := s.get(tx, bucketDEKs, namespace, &rec); err != nil {
			return err
		}
		_, err := s.get(tx, bucketKEKs, kekKey(namespace, rec.Gen()), &keks)
		return err
	})
	out := make([]keys.KEKVersion, 0, len(keks))
	for _, k := range keks {
		out = append(out, keys.KEKVersion{Version: k.Version, Created: k.Created})
	}
	return out, err
}
