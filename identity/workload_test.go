package identity_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
)

// fakeWorkloadAPI streams one fixed X.509-SVID response, as a SPIRE agent
// would for a registered workload, and keeps the stream open.
type fakeWorkloadAPI struct {
	workload.UnimplementedSpiffeWorkloadAPIServer
	resp *workload.X509SVIDResponse
}

func (f *fakeWorkloadAPI) FetchX509SVID(_ *workload.X509SVIDRequest, stream grpc.ServerStreamingServer[workload.X509SVIDResponse]) error {
	if err := stream.Send(f.resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func TestNewWorkloadSource(t *testing.T) {
	ca := newCA(t, td)
	svid := issue(t, ca, "/gateway")
	certDER, keyDER, err := svid.MarshalRaw()
	if err != nil {
		t.Fatal(err)
	}
	other := issue(t, ca, "/admin/ops")
	otherCert, otherKey, err := other.MarshalRaw()
	if err != nil {
		t.Fatal(err)
	}
	bundleDER := ca.Certificate().Raw

	sock := filepath.Join(t.TempDir(), "api.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	workload.RegisterSpiffeWorkloadAPIServer(srv, &fakeWorkloadAPI{resp: &workload.X509SVIDResponse{
		Svids: []*workload.X509SVID{
			{SpiffeId: svid.ID.String(), X509Svid: certDER, X509SvidKey: keyDER, Bundle: bundleDER},
			{SpiffeId: other.ID.String(), X509Svid: otherCert, X509SvidKey: otherKey, Bundle: bundleDER},
		},
	}})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A workload entitled to several SVIDs picks one by ID; an ID it is
	// not entitled to yields no source at all.
	picked, err := identity.NewWorkloadSource(ctx, "unix://"+sock, other.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := picked.GetX509SVID(); err != nil || got.ID != other.ID {
		t.Fatalf("picked %v, %v; want %v", got, err, other.ID)
	}
	picked.Close()
	if s, err := identity.NewWorkloadSource(ctx, "unix://"+sock, "spiffe://nvmegate.test/node/nobody"); err == nil {
		s.Close()
		t.Fatal("a source for an SVID the workload API does not offer")
	}

	src, err := identity.NewWorkloadSource(ctx, "unix://"+sock, "")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	got, err := src.GetX509SVID()
	if err != nil || got.ID != svid.ID || serial(got).Cmp(serial(svid)) != 0 {
		t.Fatalf("GetX509SVID = %v, %v; want %v", got, err, svid.ID)
	}
	if _, _, err := x509svid.Verify(got.Certificates, src); err != nil {
		t.Errorf("SVID does not verify against the source's bundle: %v", err)
	}
	if _, err := src.GetX509BundleForTrustDomain(evilTD); err == nil {
		t.Error("got a bundle for a foreign trust domain")
	}
}
