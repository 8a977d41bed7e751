package nodeagent

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Only the gateway's word that a grant is over ends it; a gateway that
// does not answer is retried.
func TestGrantEnded(t *testing.T) {
	for c, want := range map[codes.Code]bool{
		codes.NotFound: true, codes.FailedPrecondition: true, codes.PermissionDenied: true,
		codes.Unavailable: false, codes.DeadlineExceeded: false, codes.Internal: false, codes.Canceled: false,
	} {
		err := fmt.Errorf("renew: %w", status.Error(c, "x"))
		if grantEnded(err) != want {
			t.Errorf("%v: grantEnded = %v", c, !want)
		}
	}
	if grantEnded(errors.New("plain")) || grantEnded(nil) {
		t.Error("a non-gRPC error or none ends the grant")
	}
}

func TestInterval(t *testing.T) {
	a := &Agent{RenewEvery: time.Hour, subs: map[string]*sub{
		"a": {grant: &pb.Grant{}, lifetime: 30 * time.Minute},
		"b": {lifetime: time.Second}, // no grant: not counted
	}}
	if got := a.interval(); got != 10*time.Minute {
		t.Errorf("interval = %v, want a third of the shortest grant (10m)", got)
	}
	a.subs["a"].lifetime = time.Second
	if got := a.interval(); got != time.Second {
		t.Errorf("interval = %v, want the 1s floor", got)
	}
	if got := (&Agent{}).interval(); got != time.Minute {
		t.Errorf("default interval = %v", got)
	}
}

// The gateway's answer becomes a connection only if it is whole and
// valid; the error names the field, not the secret.
func TestConnection(t *testing.T) {
	g := &pb.Grant{HostNqn: "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000", SubsystemNqn: "nqn.2026-01.io.example:a",
		Ports: []*pb.DiscoveryEntry{{Trtype: "tcp", Traddr: "127.0.0.1", Trsvcid: "4420"}}, ExpiresAt: timestamppb.Now()}
	if _, err := connection(g, nil); err == nil {
		t.Error("no credentials: accepted")
	}
	_, err := connection(g, &pb.Credentials{DhchapHostSecret: "DHHC-1:00:not-a-secret:"})
	if err == nil || strings.Contains(err.Error(), "not-a-secret") {
		t.Errorf("a malformed secret: %v", err)
	}
	g.Ports[0].Traddr = "storage.example"
	if _, err := connection(g, &pb.Credentials{TlsPsk: "x"}); err == nil {
		t.Error("a host name as traddr: accepted")
	}
}
