package devca

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// File names used by Save and Load inside the CA directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca.key"
)

// Save writes the root certificate to dir/ca.pem (0644) and its key to
// dir/ca.key (0600, PKCS#8 PEM), creating dir (0700) if needed.
func (c *CA) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devca: save: %w", err)
	}
	keyPEM, err := encodeKey(c.key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
	return writeFileAtomic(filepath.Join(dir, CACertFile), certPEM, 0o644)
}

// Load reads a CA written by Save from dir. The trust domain is taken from
// the root's URI SAN. It returns an error wrapping ErrInvalidCA if the files
// do not form a usable CA.
func Load(dir string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("devca: load: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("devca: load: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: %s: no CERTIFICATE block", ErrInvalidCA, CACertFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidCA, CACertFile, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrInvalidCA, CACertFile)
	}
	if len(cert.URIs) != 1 {
		return nil, fmt.Errorf("%w: %s must have exactly one URI SAN", ErrInvalidCA, CACertFile)
	}
	td, err := spiffeid.TrustDomainFromURI(cert.URIs[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidCA, CACertFile, err)
	}
	// Never include key bytes in errors: only say what is wrong.
	block, _ = pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("%w: %s: no PKCS#8 PRIVATE KEY block", ErrInvalidCA, CAKeyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: cannot parse key", ErrInvalidCA, CAKeyFile)
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: %s: key %T cannot sign", ErrInvalidCA, CAKeyFile, parsed)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s does not match %s", ErrInvalidCA, CAKeyFile, CACertFile)
	}
	return &CA{td: td, cert: cert, key: key}, nil
}

// WriteSVID writes svid to dir/<name>.pem (certificate chain, leaf first,
// 0644) and dir/<name>.key (PKCS#8 PEM, 0600). Each file is replaced
// atomically, but the pair is not: the key is renamed into place first, then
// the chain. A reader that looks between the two renames sees the new key
// with the old chain; identity.FileSource rejects that pair (the key does not
// match the leaf), keeps serving its previous SVID, and loads the new pair on
// its next access after the chain has been renamed, since the chain file then
// has a new inode. Writing the chain last also suits readers that watch only
// the certificate file as the signal that a new SVID is complete. If the
// writer dies between the two renames, the files stay mismatched and a
// reader refuses them rather than serve a wrong pair.
func WriteSVID(dir, name string, svid *x509svid.SVID) error {
	if name == "" || name == "." || name == ".." || filepath.Base(name) != name {
		return fmt.Errorf("devca: invalid SVID file name %q", name)
	}
	if svid == nil {
		return errors.New("devca: nil SVID")
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		return fmt.Errorf("devca: marshal SVID: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, name+".key"), keyPEM, 0o600); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, name+".pem"), certPEM, 0o644)
}

// WriteBundle atomically writes the X.509 authorities of b as PEM
// certificates to path (0644). An empty bundle is refused: it would make
// every peer unverifiable.
func WriteBundle(path string, b *x509bundle.Bundle) error {
	if b == nil || b.Empty() {
		return errors.New("devca: empty bundle")
	}
	data, err := b.Marshal()
	if err != nil {
		return fmt.Errorf("devca: marshal bundle: %w", err)
	}
	return writeFileAtomic(path, data, 0o644)
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("devca: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// writeFileAtomic replaces path with data: it writes a temporary file in the
// same directory (so rename stays within one file system), sets perm, fsyncs
// it, renames it over path and fsyncs the directory so the rename is durable.
// Readers see the old or the new file, never a partial one, and the new file
// always has a new inode.
func writeFileAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*") // created 0600
	if err != nil {
		return fmt.Errorf("devca: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
			err = fmt.Errorf("devca: write %s: %w", path, err)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
