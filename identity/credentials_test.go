package identity_test

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

func TestMTLS_ValidClient(t *testing.T) {
	ca := newCA(t, td)
	serverSVID := issue(t, ca, "/gateway")
	addr, rec := startServer(t, identity.ServerCredentials(identity.StaticSource(serverSVID, ca.Bundle()), td))

	clientSVID := issue(t, ca, "/node/gpu-017")
	conn := dial(t, addr, identity.ClientCredentials(
		identity.StaticSource(clientSVID, ca.Bundle()), tlsconfig.AuthorizeID(serverSVID.ID)))

	st, p, err := check(t, conn)
	if err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v; want SERVING", st, err)
	}
	got := rec.last(t)
	if !got.ok || got.id != clientSVID.ID || got.serial.Cmp(serial(clientSVID)) != 0 {
		t.Errorf("server saw peer %v (ok=%v, serial %v), want %v", got.id, got.ok, got.serial, clientSVID.ID)
	}
	// The client side sees the server's verified ID the same way.
	if id, ok := identity.PeerID(peer.NewContext(t.Context(), p)); !ok || id != serverSVID.ID {
		t.Errorf("client saw server %v (ok=%v), want %v", id, ok, serverSVID.ID)
	}
	if v := p.AuthInfo.(identity.AuthInfo).State.Version; v != tls.VersionTLS13 {
		t.Errorf("negotiated TLS version %x, want TLS 1.3", v)
	}
}

func TestMTLS_Refused(t *testing.T) {
	ca := newCA(t, td)
	evil := newCA(t, evilTD)
	rogue := newCA(t, td) // same trust domain name, not in the bundle
	serverSVID := issue(t, ca, "/gateway")
	serverSrc := identity.StaticSource(serverSVID, ca.Bundle())
	addr, rec := startServer(t, identity.ServerCredentials(serverSrc, td))
	// A server that also trusts evil.test's CA (federation): evil.test's
	// SVIDs verify there, so only the trust-domain authorizer refuses them.
	federated := x509bundle.NewSet(ca.Bundle(), evil.Bundle())
	fedAddr, fedRec := startServer(t, identity.ServerCredentials(identity.StaticSource(serverSVID, federated), td))
	evilSVID := issue(t, evil, "/node/h1")
	if _, _, err := x509svid.Verify(evilSVID.Certificates, federated); err != nil {
		t.Fatalf("evil SVID does not verify against the federated set: %v", err)
	}

	authorizeServer := tlsconfig.AuthorizeID(serverSVID.ID)
	now := time.Now()

	// A client with a valid SVID that offers at most TLS 1.2.
	tls12 := &tls.Config{MaxVersion: tls.VersionTLS12}
	valid := identity.StaticSource(issue(t, ca, "/node/h1"), ca.Bundle())
	tlsconfig.HookMTLSClientConfig(tls12, valid, valid, authorizeServer)

	for _, tc := range []struct {
		name  string
		addr  string
		rec   *recorder
		creds credentials.TransportCredentials
	}{
		{
			name: "foreign trust domain",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(identity.StaticSource(evilSVID, ca.Bundle()), authorizeServer),
		},
		{
			name: "foreign trust domain with trusted bundle",
			addr: fedAddr, rec: fedRec,
			creds: identity.ClientCredentials(identity.StaticSource(evilSVID, ca.Bundle()), authorizeServer),
		},
		{
			name: "expired SVID",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(identity.StaticSource(
				issueAt(t, ca, "/node/h1", now.Add(-2*time.Hour), now.Add(-time.Hour)), ca.Bundle()), authorizeServer),
		},
		{
			name: "not yet valid SVID",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(identity.StaticSource(
				issueAt(t, ca, "/node/h1", now.Add(time.Hour), now.Add(2*time.Hour)), ca.Bundle()), authorizeServer),
		},
		{
			name: "unverifiable SVID",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(identity.StaticSource(issue(t, rogue, "/node/h1"), ca.Bundle()), authorizeServer),
		},
		{
			name: "no client certificate",
			addr: addr, rec: rec,
			creds: credentials.NewTLS(tlsconfig.TLSClientConfig(ca.Bundle(), authorizeServer)),
		},
		{
			name: "TLS 1.2",
			addr: addr, rec: rec,
			creds: credentials.NewTLS(tls12),
		},
		{
			// The client refuses a server that fails its authorizer.
			name: "unexpected server",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(valid, tlsconfig.AuthorizeID(spiffeid.RequireFromPath(td, "/other"))),
		},
		{
			name: "nil client authorizer",
			addr: addr, rec: rec,
			creds: identity.ClientCredentials(valid, nil),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.rec.count()
			_, _, err := check(t, dial(t, tc.addr, tc.creds))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("Check error = %v, want code Unavailable", err)
			}
			t.Logf("refused: %v", err)
			if n := tc.rec.count() - before; n != 0 {
				t.Fatalf("server handler reached %d times", n)
			}
		})
	}

	// The same valid client is admitted, so the refusals above are about
	// the credentials and not the setup.
	conn := dial(t, addr, identity.ClientCredentials(valid, authorizeServer))
	if st, _, err := check(t, conn); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("valid client: %v, %v", st, err)
	}
}

func TestPeerID_NoPeer(t *testing.T) {
	if _, ok := identity.PeerID(t.Context()); ok {
		t.Error("PeerID without a peer reported ok")
	}
	p := &peer.Peer{AuthInfo: credentials.TLSInfo{}}
	if _, ok := identity.PeerID(peer.NewContext(t.Context(), p)); ok {
		t.Error("PeerID accepted plain TLSInfo")
	}
}

func TestAuthorizeGateway(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	authorize := identity.AuthorizeGateway(td)
	for id, ok := range map[string]bool{
		"spiffe://example.org/gateway/nvmegated": true,
		"spiffe://example.org/gateway/a/b":       true,
		"spiffe://example.org/gateway":           false,
		"spiffe://example.org/gateway/":          false,
		"spiffe://example.org/node/gpu-1":        false,
		"spiffe://example.org/gatewayx/y":        false,
		"spiffe://evil.test/gateway/nvmegated":   false,
	} {
		parsed, err := spiffeid.FromString(id)
		if err != nil {
			if ok {
				t.Fatalf("%s: %v", id, err)
			}
			continue
		}
		if got := authorize(parsed, nil) == nil; got != ok {
			t.Errorf("AuthorizeGateway(%s) = %v, want %v", id, got, ok)
		}
	}
}

// A leaf SVID whose ID is only the trust domain (spiffe://<td>, no path)
// verifies against the bundle, but the X509-SVID spec forbids it: the
// handshake fails on both sides, and no handler runs.
func TestMTLS_RefusesTrustDomainOnlySVID(t *testing.T) {
	ca := newCA(t, td)
	bare := issueUnchecked(t, ca, "spiffe://"+td.Name())
	// go-spiffe's verification alone accepts it: the refusal below is ours.
	if id, _, err := x509svid.Verify(bare.Certificates, ca.Bundle()); err != nil || id.Path() != "" {
		t.Fatalf("Verify = %v, %v; want the trust domain's ID verified", id, err)
	}

	// As a client.
	serverSVID := issue(t, ca, "/gateway/g1")
	addr, rec := startServer(t, identity.ServerCredentials(identity.StaticSource(serverSVID, ca.Bundle()), td))
	_, _, err := check(t, dial(t, addr, identity.ClientCredentials(identity.StaticSource(bare, ca.Bundle()), tlsconfig.AuthorizeID(serverSVID.ID))))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("client with a trust-domain-only SVID: %v, want Unavailable", err)
	}
	if rec.count() != 0 {
		t.Fatalf("server handler reached %d times", rec.count())
	}

	// As a server, to a client that would accept any member of td.
	bareAddr, bareRec := startServer(t, identity.ServerCredentials(identity.StaticSource(bare, ca.Bundle()), td))
	valid := identity.StaticSource(issue(t, ca, "/node/h1"), ca.Bundle())
	_, _, err = check(t, dial(t, bareAddr, identity.ClientCredentials(valid, tlsconfig.AuthorizeMemberOf(td))))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "names only a trust domain") {
		t.Fatalf("server with a trust-domain-only SVID: %v, want Unavailable naming the reason", err)
	}
	if bareRec.count() != 0 {
		t.Fatalf("server handler reached %d times", bareRec.count())
	}

	// The same client with a workload SVID is admitted.
	if st, _, err := check(t, dial(t, addr, identity.ClientCredentials(valid, tlsconfig.AuthorizeID(serverSVID.ID)))); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("valid client: %v, %v", st, err)
	}
}
