package identity_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

var (
	td     = spiffeid.RequireTrustDomainFromString("nvmegate.test")
	evilTD = spiffeid.RequireTrustDomainFromString("evil.test")
)

func newCA(t *testing.T, td spiffeid.TrustDomain) *devca.CA {
	t.Helper()
	ca, err := devca.New(td, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue issues an SVID for path in ca's trust domain, valid for the next hour.
func issue(t *testing.T, ca *devca.CA, path string) *x509svid.SVID {
	t.Helper()
	now := time.Now()
	return issueAt(t, ca, path, now.Add(-time.Minute), now.Add(time.Hour))
}

func issueAt(t *testing.T, ca *devca.CA, path string, notBefore, notAfter time.Time) *x509svid.SVID {
	t.Helper()
	svid, err := ca.Issue(spiffeid.RequireFromPath(ca.TrustDomain(), path), notBefore, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	return svid
}

func serial(svid *x509svid.SVID) *big.Int { return svid.Certificates[0].SerialNumber }

// call is what the server saw of one RPC that reached it.
type call struct {
	id     spiffeid.ID
	ok     bool
	serial *big.Int // client leaf serial
}

// recorder is a unary interceptor that records every call reaching the
// server: if a handshake is refused, it records nothing.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	c := call{}
	c.id, c.ok = identity.PeerID(ctx)
	if p, ok := peer.FromContext(ctx); ok {
		if ai, ok := p.AuthInfo.(identity.AuthInfo); ok && len(ai.State.PeerCertificates) > 0 {
			c.serial = ai.State.PeerCertificates[0].SerialNumber
		}
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return h(ctx, req)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *recorder) last(t *testing.T) call {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) == 0 {
		t.Fatal("no call reached the server")
	}
	return r.calls[len(r.calls)-1]
}

// startServer serves the standard health service over creds on 127.0.0.1:0.
func startServer(t *testing.T, creds credentials.TransportCredentials) (string, *recorder) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	srv := grpc.NewServer(grpc.Creds(creds), grpc.UnaryInterceptor(rec.intercept))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), rec
}

func dial(t *testing.T, addr string, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// check runs a health Check on conn and returns the response status, the
// server's peer information and the error.
func check(t *testing.T, conn *grpc.ClientConn) (healthpb.HealthCheckResponse_ServingStatus, *peer.Peer, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := new(peer.Peer)
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(p))
	if err != nil {
		return 0, nil, err
	}
	return resp.GetStatus(), p, nil
}

// serverSerial checks conn and returns the serial of the server's leaf.
func serverSerial(t *testing.T, conn *grpc.ClientConn) *big.Int {
	t.Helper()
	st, p, err := check(t, conn)
	if err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v; want SERVING", st, err)
	}
	ai, ok := p.AuthInfo.(identity.AuthInfo)
	if !ok {
		t.Fatalf("client AuthInfo is %T, want identity.AuthInfo", p.AuthInfo)
	}
	return ai.State.PeerCertificates[0].SerialNumber
}

// writeAtomic replaces path with data by rename, as a careful writer would.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger used from handshakes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// issueUnchecked signs a leaf certificate for uri with ca's key, as devca
// would but without its checks (devca refuses a trust-domain-only ID): for
// peers that break the X509-SVID spec in ways go-spiffe's verification
// lets through.
func issueUnchecked(t *testing.T, ca *devca.CA, uri string) *x509svid.SVID {
	t.Helper()
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	pemKey, err := os.ReadFile(filepath.Join(dir, devca.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemKey)
	caKey, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(now.UnixNano()),
		URIs:                  []*url.URL{u},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Certificate(), key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	id, err := x509svid.IDFromCert(cert)
	if err != nil {
		t.Fatal(err)
	}
	return &x509svid.SVID{ID: id, Certificates: []*x509.Certificate{cert}, PrivateKey: key}
}
