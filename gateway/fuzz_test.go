package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nvmegate/nvmegate"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// FuzzValidate feeds arbitrary wire bytes to every request type the gateway
// validates: whatever decodes must be validated without a panic, and what
// validates must be described for policy (against a real, empty store)
// without one.
func FuzzValidate(f *testing.F) {
	seeds := []proto.Message{
		&pb.AddTargetRequest{Target: &pb.Target{Id: "t", Ports: []*pb.Port{{Id: 70000, Address: "::1", AddressFamily: "ipv4"}}}},
		&pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: "nqn.2026-01.io.x:y", PortIds: []uint32{0, 1}}},
		&pb.AddNamespaceRequest{Namespace: &pb.Namespace{Nsid: 1, Dataset: &pb.Dataset{Digest: "sha256:"}}},
		&pb.AdmitRequest{JobId: "j", Namespaces: []*pb.JobNamespace{nil, {Mode: 7}}},
		&pb.RevokeRequest{Selector: &pb.RevokeRequest_Node{Node: "spiffe://x/y"}},
		&pb.ExplainRequest{InputJson: []byte(`{"a":1}`), CandidateModules: map[string]string{"a.rego": ""}},
		&pb.QueryRequest{Kinds: []string{"grant"}},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	types := []func() proto.Message{
		func() proto.Message { return &pb.AddTargetRequest{} },
		func() proto.Message { return &pb.AddSubsystemRequest{} },
		func() proto.Message { return &pb.AddNamespaceRequest{} },
		func() proto.Message { return &pb.AddHostBindingRequest{} },
		func() proto.Message { return &pb.AdmitRequest{} },
		func() proto.Message { return &pb.ConnectRequest{} },
		func() proto.Message { return &pb.RevokeRequest{} },
		func() proto.Message { return &pb.RotateRequest{} },
		func() proto.Message { return &pb.ExplainRequest{} },
		func() proto.Message { return &pb.QueryRequest{} },
		func() proto.Message { return &pb.ListNamespacesRequest{} },
		func() proto.Message { return &pb.ConsistencyProofRequest{} },
	}
	now := time.Unix(1_800_000_000, 0)
	db, err := store.Open(filepath.Join(f.TempDir(), "inventory.db"), store.Options{})
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	d := describer{ctx: context.Background(), store: db}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		m := types[int(kind)%len(types)]()
		if proto.Unmarshal(data, m) != nil {
			return
		}
		if validate(m, now) == nil {
			if _, err := d.resource(m); err != nil && nvmegate.ErrorCode(err) != nvmegate.EINVALID {
				t.Fatalf("describe(%v): %v", m, err)
			}
		}
	})
}

// A message of our API without a validation case is refused, not waved
// through: adding an RPC without its validation fails closed.
func TestValidateUnknownAPIMessage(t *testing.T) {
	if err := validate(&pb.ExportResponse{}, time.Now()); err == nil || !strings.Contains(err.Error(), "no validation for nvmegate.v1.ExportResponse") {
		t.Fatalf("validate(unknown API message) = %v", err)
	}
	if err := validate(struct{}{}, time.Now()); err != nil {
		t.Fatalf("validate(foreign type) = %v", err)
	}
}
