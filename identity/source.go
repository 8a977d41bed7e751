package identity

import (
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Source provides this process's X.509-SVID and the trust bundles used to
// verify peers. go-spiffe calls it on every TLS handshake, so an
// implementation must be cheap and must pick up rotated SVIDs and bundles by
// itself. Implementations: the Workload API (NewWorkloadSource, production),
// PEM files (NewFileSource) and fixed values (StaticSource, tests).
type Source interface {
	x509svid.Source
	x509bundle.Source
	// Close releases the source. Handshakes after Close may fail.
	Close() error
}

// StaticSource returns a Source that always serves svid and looks bundles up
// in bundles (an *x509bundle.Bundle for one trust domain or an
// *x509bundle.Set for several). It never rotates; it is meant for tests,
// typically with an SVID issued by identity/devca.
func StaticSource(svid *x509svid.SVID, bundles x509bundle.Source) Source {
	return staticSource{svid: svid, bundles: bundles}
}

type staticSource struct {
	svid    *x509svid.SVID
	bundles x509bundle.Source
}

func (s staticSource) GetX509SVID() (*x509svid.SVID, error) { return s.svid, nil }

func (s staticSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return s.bundles.GetX509BundleForTrustDomain(td)
}

func (staticSource) Close() error { return nil }
