package devca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Errors returned by this package.
var (
	// ErrForeignTrustDomain is returned by Issue for a SPIFFE ID outside the
	// CA's trust domain. Issue it from a CA of that trust domain instead.
	ErrForeignTrustDomain = errors.New("devca: SPIFFE ID is not in the CA's trust domain")

	// ErrInvalidCA is returned by Load when ca.pem and ca.key do not form a
	// usable CA (not a CA certificate, no trust domain URI SAN, or a key that
	// does not match the certificate). Regenerate the directory with New and
	// Save.
	ErrInvalidCA = errors.New("devca: invalid CA files")
)

const (
	// caLifetime is the validity of a new root. The dev CA is never rotated.
	caLifetime = 10 * 365 * 24 * time.Hour
	// backdate tolerates small clock differences between processes.
	backdate = time.Minute
)

// CA is an in-memory X.509-SVID certificate authority for one trust domain.
// It is safe for concurrent use.
type CA struct {
	td   spiffeid.TrustDomain
	cert *x509.Certificate
	key  crypto.Signer
}

// New creates a CA for td with a fresh self-signed ECDSA P-256 root, valid
// from now-1m for ten years.
func New(td spiffeid.TrustDomain, now time.Time) (*CA, error) {
	if td.IsZero() {
		return nil, errors.New("devca: empty trust domain")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devca: generate CA key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"nvmegate dev"},
			CommonName:   "nvmegate dev CA " + td.Name(),
		},
		URIs:                  []*url.URL{td.ID().URL()},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// The dev CA signs leaves directly; it never makes intermediates.
		MaxPathLen:     0,
		MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("devca: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devca: parse CA certificate: %w", err)
	}
	return &CA{td: td, cert: cert, key: key}, nil
}

// TrustDomain returns the CA's trust domain.
func (c *CA) TrustDomain() spiffeid.TrustDomain { return c.td }

// Certificate returns the root certificate. Callers must not modify it.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Bundle returns a new trust bundle holding the root. Each call returns a
// fresh bundle, so callers may modify it.
func (c *CA) Bundle() *x509bundle.Bundle {
	return x509bundle.FromX509Authorities(c.td, []*x509.Certificate{c.cert})
}

// subject of a dev SVID: the workload's path as common name (SPIRE sets
// one from an entry's DNS name), which Vault's certificate auth needs as
// the identity alias; omitted past the 64 bytes X.520 allows.
func subject(id spiffeid.ID) pkix.Name {
	n := pkix.Name{Organization: []string{"nvmegate dev"}}
	if cn := strings.TrimPrefix(id.Path(), "/"); len(cn) <= 64 {
		n.CommonName = cn
	}
	return n
}

// Issue issues an X.509-SVID for id, valid from notBefore to notAfter. The
// validity is not checked against the current time (nor is notBefore held to
// the root's notBefore), so tests can issue expired or not-yet-valid SVIDs;
// only notAfter must not exceed the root's.
// It returns ErrForeignTrustDomain if id is not in the CA's trust domain.
func (c *CA) Issue(id spiffeid.ID, notBefore, notAfter time.Time) (*x509svid.SVID, error) {
	switch {
	case id.IsZero():
		return nil, errors.New("devca: empty SPIFFE ID")
	case !id.MemberOf(c.td):
		return nil, fmt.Errorf("%w: %q is not in %q", ErrForeignTrustDomain, id, c.td)
	case id.Path() == "":
		return nil, fmt.Errorf("devca: SPIFFE ID %q has no path; an X.509-SVID must name a workload", id)
	case !notAfter.After(notBefore):
		return nil, errors.New("devca: notAfter must be after notBefore")
	case notAfter.After(c.cert.NotAfter):
		return nil, errors.New("devca: SVID would outlive the CA")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devca: generate SVID key: %w", err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               subject(id),
		URIs:                  []*url.URL{id.URL()},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  false,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, key.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("devca: create SVID certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("devca: marshal SVID key: %w", err)
	}
	// ParseRaw re-checks everything the X509-SVID spec requires of a leaf
	// and that the key matches the certificate.
	svid, err := x509svid.ParseRaw(der, keyDER)
	if err != nil {
		return nil, fmt.Errorf("devca: issued SVID is invalid: %w", err)
	}
	return svid, nil
}

// randomSerial returns a uniformly random, non-negative 128-bit serial.
func randomSerial() (*big.Int, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("devca: serial: %w", err)
	}
	return new(big.Int).SetBytes(b[:]), nil
}
