package clientconn

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
)

// gatewayAt serves gRPC health as the dev gateway's SVID on a port of its
// own, named name (in the health service's status), until stop.
func gatewayAt(t *testing.T, dir, name string) (addr string, stop func()) {
	t.Helper()
	cert, key := devca.SVIDPaths(dir, "gateway")
	src, err := identity.NewFileSource(cert, key, devca.BundlePath(dir))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(identity.ServerCredentials(src, src.TrustDomain())))
	h := health.NewServer()
	h.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String(), s.Stop
}

// closedAddr is an address nothing listens on.
func closedAddr(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// serving says which of the named gateways answered.
func serving(ctx context.Context, conn *grpc.ClientConn, names ...string) (string, error) {
	var err error
	for _, n := range names {
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: n}, grpc.WaitForReady(true))
		if err == nil {
			return n, nil
		}
	}
	return "", err
}

// A list of replicas' addresses: the client skips one that is down, and
// when the replica it uses stops, goes on through another.
func TestDialReplicas(t *testing.T) {
	dir := t.TempDir()
	if err := devca.Provision(dir, devca.DevIdentities, time.Now()); err != nil {
		t.Fatal(err)
	}
	a, stopA := gatewayAt(t, dir, "a")
	b, _ := gatewayAt(t, dir, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, src, err := Dial(ctx, Options{DevDir: dir, DevIdentity: "admin", Addr: strings.Join([]string{closedAddr(t), a, b}, ",")})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	defer conn.Close()
	if got, err := serving(ctx, conn, "a", "b"); err != nil || got != "a" {
		t.Fatalf("first call answered by %q (%v), want a: the first replica that is up", got, err)
	}
	stopA()
	var got string
	for got != "b" && ctx.Err() == nil {
		got, _ = serving(ctx, conn, "b")
	}
	if got != "b" {
		t.Fatalf("after a stopped, no call reached b: %v", ctx.Err())
	}
}

func TestDialReplicasRefusesBadList(t *testing.T) {
	dir := t.TempDir()
	if err := devca.Provision(dir, devca.DevIdentities, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:1,", "127.0.0.1:1,,127.0.0.1:2", "127.0.0.1:1,nohost"} {
		_, _, err := Dial(context.Background(), Options{DevDir: dir, DevIdentity: "admin", Addr: addr})
		if err == nil || !strings.Contains(err.Error(), "must be host:port") {
			t.Errorf("Dial(%q) = %v, want a refusal naming host:port", addr, err)
		}
	}
}
