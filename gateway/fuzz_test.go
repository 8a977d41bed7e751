package gateway

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// FuzzValidate feeds arbitrary wire bytes to the request type of every RPC
// of every service (taken from the registered descriptors, so a new RPC is
// fuzzed without editing this list): whatever decodes must be validated without a panic, and what
// validates must be described for policy (against a real, empty store)
// without one; what is refused as malformed makes an audit entry the log
// takes, without a value of the request in it.
func FuzzValidate(f *testing.F) {
	seeds := []proto.Message{
		&pb.AddTargetRequest{Target: &pb.Target{Id: "t", Ports: []*pb.Port{{Id: 70000, Address: "::1", AddressFamily: "ipv4"}}}},
		&pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: "nqn.2026-01.io.x:y", PortIds: []uint32{0, 1}}},
		&pb.AddNamespaceRequest{Namespace: &pb.Namespace{Nsid: 1, Dataset: &pb.Dataset{Digest: "sha256:"}}},
		&pb.AdmitRequest{JobId: "j", Namespaces: []*pb.JobNamespace{nil, {Mode: 7}}},
		&pb.RevokeRequest{Selector: &pb.RevokeRequest_Node{Node: "spiffe://x/y"}},
		&pb.ExplainRequest{InputJson: []byte(`{"a":1}`), CandidateModules: map[string]string{"a.rego": ""}},
		&pb.QueryRequest{Kinds: []string{"grant"}},
		&pb.ConnectRequest{JobId: "DHHC-1:01:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=:", SubsystemNqn: "nqn.2026-01.io.x:y"},
		&pb.JobsGetRequest{JobId: `job "x" \"NVMeTLSkey-1:01:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=:`},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	types := rpcInputs(f)
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
		err := validate(m, now)
		if err == nil {
			if _, err := d.resource(m); err != nil && nvmegate.ErrorCode(err) != nvmegate.EINVALID {
				t.Fatalf("describe(%v): %v", m, err)
			}
			return
		}
		if nvmegate.ErrorCode(err) != nvmegate.EINVALID {
			return
		}
		// The refusal's audit entry is one the log takes, and holds no
		// value of the request.
		detail := invalidDetail(err)
		e := audit.Entry{Kind: audit.EventInvalid, Time: now, Caller: "spiffe://nvmegate.test/node/n", Detail: detail}
		if _, err := e.Encode(); err != nil {
			t.Fatalf("entry of %v: %v", m, err)
		}
		for _, v := range stringsOf(m.ProtoReflect()) {
			if len(v) >= 16 && strings.Contains(detail, v) {
				t.Fatalf("detail %q holds the request's value %q", detail, v)
			}
		}
	})
}

// stringsOf returns every string in a message: fields, lists, map keys and
// values, nested messages.
func stringsOf(m protoreflect.Message) []string {
	var out []string
	var value func(fd protoreflect.FieldDescriptor, v protoreflect.Value)
	value = func(fd protoreflect.FieldDescriptor, v protoreflect.Value) {
		switch fd.Kind() {
		case protoreflect.StringKind:
			out = append(out, v.String())
		case protoreflect.MessageKind, protoreflect.GroupKind:
			out = append(out, stringsOf(v.Message())...)
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				value(fd, v.List().Get(i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapKey().Kind() == protoreflect.StringKind {
					out = append(out, k.String())
				}
				value(fd.MapValue(), mv)
				return true
			})
		default:
			value(fd, v)
		}
		return true
	})
	return out
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

// rpcInputs returns constructors of the input message of every RPC of the
// nvmegate.v1 services.
func rpcInputs(tb testing.TB) []func() proto.Message {
	tb.Helper()
	var out []func() proto.Message
	protoregistry.GlobalFiles.RangeFilesByPackage("nvmegate.v1", func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			ms := fd.Services().Get(i).Methods()
			for j := range ms.Len() {
				mt, err := protoregistry.GlobalTypes.FindMessageByName(ms.Get(j).Input().FullName())
				if err != nil {
					tb.Fatal(err)
				}
				out = append(out, func() proto.Message { return mt.New().Interface() })
			}
		}
		return true
	})
	if len(out) < 30 {
		tb.Fatalf("only %d RPCs found in the registry", len(out))
	}
	return out
}

// Every RPC's request type has a validation case: an empty request is
// either valid or refused naming a field, never "no validation for".
func TestEveryRPCValidated(t *testing.T) {
	for _, newMsg := range rpcInputs(t) {
		m := newMsg()
		if err := validate(m, time.Now()); err != nil && strings.Contains(err.Error(), "no validation for") {
			t.Errorf("%s: %v", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
}
