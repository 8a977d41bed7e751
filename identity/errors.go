package identity

import "errors"

// Errors returned by this package.
var (
	// ErrUnknownTrustDomain is returned by a FileSource asked for the bundle
	// of a trust domain other than its own. A TLS handshake with a peer from
	// that trust domain fails; federate through the Workload API instead.
	ErrUnknownTrustDomain = errors.New("identity: no trust bundle for trust domain")

	// ErrNoPeerID is returned by a handshake whose peer presented no
	// certificate with a SPIFFE ID; the connection is closed.
	ErrNoPeerID = errors.New("identity: peer has no SPIFFE ID")
)
