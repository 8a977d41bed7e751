package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffegrpc/grpccredentials"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ServerCredentials returns gRPC server credentials for mutual TLS with
// X.509-SVIDs: the server presents src's SVID, and a client must present an
// X.509-SVID that chains to src's bundle for its trust domain, is a member
// of td and names a workload (a path after the trust domain). A client from
// another trust domain, with an expired or unverifiable SVID, with an SVID
// naming only the trust domain, with no certificate, or offering less than
// TLS 1.3 fails the handshake, so no handler ever runs for it. A zero td
// admits no client.
//
// The TLS configuration is go-spiffe's (tlsconfig.HookMTLSServerConfig). It
// is not grpccredentials.MTLSServerCredentials because that builds its own
// tls.Config with MinVersion TLS 1.2 and no way to raise it; the hook keeps a
// MinVersion that is already set. Session tickets are disabled: go-spiffe
// verifies peers in VerifyPeerCertificate, which crypto/tls skips on
// resumption, so a resumed session would escape a bundle change. gRPC
// connections are long-lived, so full handshakes cost little.
func ServerCredentials(src Source, td spiffeid.TrustDomain) credentials.TransportCredentials {
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, SessionTicketsDisabled: true}
	tlsconfig.HookMTLSServerConfig(cfg, src, src, authorizeWorkload(tlsconfig.AuthorizeMemberOf(td)))
	return &spiffeCredentials{TransportCredentials: credentials.NewTLS(cfg)}
}

// ClientCredentials returns gRPC client credentials for mutual TLS with
// X.509-SVIDs: the client presents src's SVID and accepts a server whose
// X.509-SVID chains to src's bundle, names a workload (not only a trust
// domain) and passes authorize (for example
// tlsconfig.AuthorizeID(gatewayID)). A nil authorize accepts no server.
// TLS 1.3 is required, and sessions are never resumed.
func ClientCredentials(src Source, authorize tlsconfig.Authorizer) credentials.TransportCredentials {
	return &spiffeCredentials{TransportCredentials: credentials.NewTLS(ClientTLSConfig(src, authorize))}
}

// ClientTLSConfig is the TLS configuration ClientCredentials uses, for a
// client that speaks TLS without gRPC (the load generator's handshake
// floor measures exactly the handshakes a node's gRPC connection makes).
func ClientTLSConfig(src Source, authorize tlsconfig.Authorizer) *tls.Config {
	if authorize == nil {
		authorize = func(spiffeid.ID, [][]*x509.Certificate) error {
			return errors.New("identity: no server authorizer configured")
		}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13}
	tlsconfig.HookMTLSClientConfig(cfg, src, src, authorizeWorkload(authorize))
	return cfg
}

// authorizeWorkload refuses a peer whose X.509-SVID names only a trust
// domain (spiffe://<td>, no path) before asking authorize. The X509-SVID
// spec requires a leaf's SPIFFE ID to have a non-root path (§3.1) and a
// validator to check it (§5.2); go-spiffe's x509svid.Verify checks the
// chain, the CA flag and the key usage, not the path, so a trust-domain-only
// leaf (a CA misconfigured, a registration entry without a path) would
// otherwise pass the handshake as a caller no role convention describes.
func authorizeWorkload(authorize tlsconfig.Authorizer) tlsconfig.Authorizer {
	return func(id spiffeid.ID, chains [][]*x509.Certificate) error {
		if id.Path() == "" {
			return fmt.Errorf("identity: peer SVID %s names only a trust domain; a leaf X.509-SVID must name a workload", id)
		}
		return authorize(id, chains)
	}
}

// AuthInfo is the credentials.AuthInfo of a connection made with
// ServerCredentials or ClientCredentials: the TLS state plus the peer's SPIFFE
// ID, which the handshake verified. Read it from a gRPC peer.Peer; note that
// a type assertion to credentials.TLSInfo fails on it, assert AuthInfo.
type AuthInfo struct {
	credentials.TLSInfo
	// ID is the peer's verified SPIFFE ID; never zero.
	ID spiffeid.ID
}

// PeerID returns the SPIFFE ID the TLS handshake verified for the peer of
// ctx (a gRPC handler's context on the server side). It reports false if the
// connection was not authenticated by ServerCredentials, ClientCredentials or
// go-spiffe's grpccredentials, whose PeerIDFromPeer it falls back to.
func PeerID(ctx context.Context) (spiffeid.ID, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return spiffeid.ID{}, false
	}
	if info, ok := p.AuthInfo.(AuthInfo); ok {
		return info.ID, !info.ID.IsZero()
	}
	return grpccredentials.PeerIDFromPeer(p)
}

// spiffeCredentials wraps gRPC's TLS credentials to attach the peer's SPIFFE
// ID to the connection's AuthInfo, as grpccredentials does internally.
type spiffeCredentials struct {
	credentials.TransportCredentials
}

func (c *spiffeCredentials) ClientHandshake(ctx context.Context, authority string, rawConn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return withPeerID(c.TransportCredentials.ClientHandshake(ctx, authority, rawConn))
}

func (c *spiffeCredentials) ServerHandshake(rawConn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return withPeerID(c.TransportCredentials.ServerHandshake(rawConn))
}

func (c *spiffeCredentials) Clone() credentials.TransportCredentials {
	return &spiffeCredentials{TransportCredentials: c.TransportCredentials.Clone()}
}

// withPeerID turns a completed handshake's TLSInfo into an AuthInfo. By now
// go-spiffe's VerifyPeerCertificate has verified the presented chain and
// authorized its leaf, so the leaf's URI SAN is the verified ID.
func withPeerID(conn net.Conn, info credentials.AuthInfo, err error) (net.Conn, credentials.AuthInfo, error) {
	if err != nil {
		return nil, nil, err
	}
	tlsInfo, ok := info.(credentials.TLSInfo)
	if !ok || len(tlsInfo.State.PeerCertificates) == 0 {
		conn.Close()
		return nil, nil, ErrNoPeerID
	}
	id, err := x509svid.IDFromCert(tlsInfo.State.PeerCertificates[0])
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("%w: %v", ErrNoPeerID, err)
	}
	return conn, AuthInfo{TLSInfo: tlsInfo, ID: id}, nil
}

// GatewayPathPrefix starts the SPIFFE ID path of every gateway replica
// (spiffe://<td>/gateway/<name>, DESIGN §3).
const GatewayPathPrefix = "/gateway/"

// AuthorizeGateway accepts a server only if its SVID names a gateway of td.
// Clients use it by default: trust-domain membership alone would let any
// workload of the domain (a node, a scheduler) pose as the gateway, since
// every X.509-SVID is valid for server authentication.
func AuthorizeGateway(td spiffeid.TrustDomain) tlsconfig.Authorizer {
	return func(id spiffeid.ID, _ [][]*x509.Certificate) error {
		if !id.MemberOf(td) || !strings.HasPrefix(id.Path(), GatewayPathPrefix) || len(id.Path()) == len(GatewayPathPrefix) {
			return fmt.Errorf("identity: %s is not a gateway of trust domain %s", id, td)
		}
		return nil
	}
}
