package identity

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// maxFileSize bounds what a FileSource reads from one PEM file.
const maxFileSize = 1 << 20

// FileSource serves an X.509-SVID and its trust bundle from PEM files: a
// certificate chain (leaf first), a PKCS#8 private key (may be the same file
// as the chain) and a bundle of CA certificates for the SVID's own trust
// domain. It implements Source and is safe for concurrent use.
//
// Rotation needs no restart and no timer. On every GetX509SVID the chain and
// key files are stat'ed, on every GetX509BundleForTrustDomain the bundle file
// is; if a file's identity (inode), size, mtime or ctime differs from the
// version last read, that unit (SVID or bundle) is reloaded. go-spiffe calls
// these on every TLS handshake, so a handshake that starts after a file was
// replaced uses the new file. The check is at most two stat calls under a
// mutex (a few microseconds, see BenchmarkFileSource_GetX509SVID), small
// against a handshake's signatures; stat'ing under the mutex keeps it simple
// and makes concurrent handshakes agree on which version they saw.
//
// Replace files atomically: write a temporary file in the same directory and
// rename it over the old one, as devca.WriteSVID does; see stamp for why one
// rename is always detected and an in-place rewrite may not be.
//
// If a changed unit fails to load (unreadable, bad PEM, not a valid X.509-SVID
// per x509svid.Parse, a key that does not match the leaf, an SVID of another
// trust domain, an empty bundle), the source keeps serving the last good one
// and logs one warning per changed set of files. Warnings name files and the
// parse error, never key material. It tries again when the files change again.
//
// The trust domain is fixed by the SVID loaded at construction; the bundle
// file holds that trust domain's CA certificates.
type FileSource struct {
	certFile, keyFile, bundleFile string
	td                            spiffeid.TrustDomain
	log                           *slog.Logger

	mu         sync.Mutex
	svid       *x509svid.SVID
	svidSeen   [2]stamp // chain and key files as of the last load attempt
	bundle     *x509bundle.Bundle
	bundleSeen stamp
}

// FileSourceOption configures a FileSource.
type FileSourceOption func(*FileSource)

// WithLogger sets the logger for rotation events and failed reloads. The
// default is slog.Default().
func WithLogger(l *slog.Logger) FileSourceOption {
	return func(s *FileSource) {
		if l != nil {
			s.log = l
		}
	}
}

// NewFileSource loads the SVID from certFile and keyFile and the bundle from
// bundleFile. It fails if any of them cannot be loaded.
func NewFileSource(certFile, keyFile, bundleFile string, opts ...FileSourceOption) (*FileSource, error) {
	s := &FileSource{
		certFile:   certFile,
		keyFile:    keyFile,
		bundleFile: bundleFile,
		log:        slog.Default(),
	}
	for _, opt := range opts {
		opt(s)
	}
	svid, seen, err := loadSVID(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	s.td = svid.ID.TrustDomain()
	bundle, bundleSeen, err := loadBundle(s.td, bundleFile)
	if err != nil {
		return nil, err
	}
	s.svid, s.svidSeen = svid, seen
	s.bundle, s.bundleSeen = bundle, bundleSeen
	// A key others can read is a key others may have copied. Warn rather
	// than refuse: some secret mounts (Kubernetes' default 0644) need a
	// deployment fix the operator has to make first.
	if fi, err := os.Stat(keyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		s.log.Warn("SVID key file is readable by group or others; make it 0600",
			"file", keyFile, "mode", fi.Mode().Perm().String())
	}
	return s, nil
}

// TrustDomain returns the trust domain of the served SVID and bundle.
func (s *FileSource) TrustDomain() spiffeid.TrustDomain { return s.td }

// GetX509SVID returns the current X.509-SVID, reloading it first if its files
// changed. It implements x509svid.Source and never fails.
func (s *FileSource) GetX509SVID() (*x509svid.SVID, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !statStamp(s.certFile).equal(s.svidSeen[0]) || !statStamp(s.keyFile).equal(s.svidSeen[1]) {
		s.reloadSVIDLocked()
	}
	return s.svid, nil
}

// GetX509BundleForTrustDomain returns the bundle for td, reloading it first
// if the bundle file changed. It returns an error wrapping
// ErrUnknownTrustDomain for any trust domain but the SVID's own. It
// implements x509bundle.Source.
func (s *FileSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != s.td {
		return nil, fmt.Errorf("%w %q", ErrUnknownTrustDomain, td)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !statStamp(s.bundleFile).equal(s.bundleSeen) {
		s.reloadBundleLocked()
	}
	return s.bundle, nil
}

// Close does nothing: a FileSource holds no open files or goroutines. It
// exists so that a FileSource is a Source.
func (s *FileSource) Close() error { return nil }

func (s *FileSource) reloadSVIDLocked() {
	svid, seen, err := loadSVID(s.certFile, s.keyFile)
	// Remember what was tried even if it failed, so a broken set is reported
	// once rather than on every handshake, and retried when it changes.
	s.svidSeen = seen
	if err == nil && svid.ID.TrustDomain() != s.td {
		err = fmt.Errorf("identity: SVID %q is not in trust domain %q", svid.ID, s.td)
	}
	if err != nil {
		s.log.Warn("identity: cannot reload X.509-SVID, keeping the previous one",
			"cert_file", s.certFile, "key_file", s.keyFile,
			"serving_serial", serialHex(s.svid), "err", err)
		return
	}
	s.svid = svid
	s.log.Info("identity: reloaded X.509-SVID",
		"cert_file", s.certFile, "id", svid.ID.String(), "serial", serialHex(svid),
		"not_after", svid.Certificates[0].NotAfter)
}

func (s *FileSource) reloadBundleLocked() {
	bundle, seen, err := loadBundle(s.td, s.bundleFile)
	s.bundleSeen = seen
	if err != nil {
		s.log.Warn("identity: cannot reload trust bundle, keeping the previous one",
			"bundle_file", s.bundleFile, "err", err)
		return
	}
	s.bundle = bundle
	s.log.Info("identity: reloaded trust bundle",
		"bundle_file", s.bundleFile, "trust_domain", s.td.String(),
		"authorities", len(bundle.X509Authorities()))
}

// loadSVID reads and validates an SVID. It returns the stamps of the file
// versions it read (zero stamps for files it could not open) even on error.
func loadSVID(certFile, keyFile string) (*x509svid.SVID, [2]stamp, error) {
	var seen [2]stamp
	certPEM, certErr := readStamped(certFile, &seen[0])
	keyPEM, keyErr := readStamped(keyFile, &seen[1])
	defer clear(keyPEM)
	if err := errors.Join(certErr, keyErr); err != nil {
		return nil, seen, fmt.Errorf("identity: load X.509-SVID: %w", err)
	}
	// Parse checks the chain shape required of an X.509-SVID and that the
	// key matches the leaf's public key. Its errors hold no key bytes.
	svid, err := x509svid.Parse(certPEM, keyPEM)
	if err != nil {
		return nil, seen, fmt.Errorf("identity: load X.509-SVID from %s and %s: %w", certFile, keyFile, err)
	}
	return svid, seen, nil
}

func loadBundle(td spiffeid.TrustDomain, bundleFile string) (*x509bundle.Bundle, stamp, error) {
	var seen stamp
	data, err := readStamped(bundleFile, &seen)
	if err != nil {
		return nil, seen, fmt.Errorf("identity: load trust bundle: %w", err)
	}
	bundle, err := x509bundle.Parse(td, data)
	if err != nil {
		return nil, seen, fmt.Errorf("identity: load trust bundle from %s: %w", bundleFile, err)
	}
	if bundle.Empty() {
		// An empty file (e.g. truncated by a non-atomic writer) would
		// otherwise make every peer unverifiable.
		return nil, seen, fmt.Errorf("identity: trust bundle %s has no certificates", bundleFile)
	}
	return bundle, seen, nil
}

// readStamped reads path and sets *st to the stamp of the very file version
// read (fstat of the open file), so a replacement racing with the read is
// detected on the next look.
func readStamped(path string, st *stamp) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	*st = fileStamp(f)
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		clear(data)
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxFileSize)
	}
	return data, nil
}

func serialHex(svid *x509svid.SVID) string {
	if svid == nil || len(svid.Certificates) == 0 {
		return ""
	}
	return svid.Certificates[0].SerialNumber.Text(16)
}
