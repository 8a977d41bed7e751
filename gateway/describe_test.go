package gateway

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// Policy decides on stored records: a request that names a record gets the
// store's tenant, region and class, whatever the caller may claim.
func TestDescribeUsesStoredRecords(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(filepath.Join(t.TempDir(), "inventory.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const sub = "nqn.2026-01.io.nvmegate.test:acme-train"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(db.CreateTarget(ctx, &nvmegate.Target{ID: "stor-eu-1", Fabric: "fab-eu", Region: "eu-west", Driver: "nvmet",
		Ports: []nvmegate.Port{{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"}}}))
	must(db.CreateSubsystem(ctx, &nvmegate.Subsystem{NQN: sub, TargetID: "stor-eu-1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}))
	must(db.CreateNamespace(ctx, &nvmegate.Namespace{SubsystemNQN: sub, NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: "immutable",
		Dataset: nvmegate.Dataset{Name: "cc", Digest: "sha256:" + string(make64('a'))}}))
	must(db.CreateHostBinding(ctx, &nvmegate.HostBinding{SPIFFEID: "spiffe://nvmegate.test/node/b", HostNQN: "nqn.2026-01.io.nvmegate.test:host-b", Tenant: "globex"}))
	d := describer{ctx: ctx, store: db}

	r, err := d.resource(&pb.GetNamespaceRequest{SubsystemNqn: sub, Nsid: 1})
	must(err)
	ns := r["namespaces"].([]any)[0].(map[string]any)
	if r["tenant"] != "acme" || ns["data_class"] != "immutable" || ns["target"].(map[string]any)["region"] != "eu-west" || r["subsystem"].(map[string]any)["tenant"] != "acme" {
		t.Fatalf("GetNamespace resource = %v", r)
	}
	r, err = d.resource(&pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: sub})
	must(err)
	if r["kind"] != "key" || r["tenant"] != "acme" {
		t.Fatalf("Rotate resource = %v", r)
	}
	// A record that does not exist: its key only, no tenant.
	r, err = d.resource(&pb.GetSubsystemRequest{Nqn: sub + "-x"})
	must(err)
	if r["tenant"] != "" || r["subsystem"].(map[string]any)["tenant"] != nil {
		t.Fatalf("missing subsystem resource = %v", r)
	}

	// Admission: stored namespaces with the requested modes, bindings of
	// bound and unbound nodes.
	r, err = d.resource(&pb.AdmitRequest{JobId: "j1", Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test/node/a", "spiffe://nvmegate.test/node/b"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: sub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_WRITE}, {SubsystemNqn: sub, Nsid: 9, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Unix(1_900_000_000, 0))})
	must(err)
	nss := r["namespaces"].([]any)
	if got := nss[0].(map[string]any); got["mode"] != "rw" || got["data_class"] != "immutable" || got["tenant"] != "acme" {
		t.Fatalf("admitted namespace = %v", got)
	}
	if got := nss[1].(map[string]any); got["tenant"] != nil || got["mode"] != "ro" {
		t.Fatalf("unknown namespace = %v", got)
	}
	nodes := r["nodes"].([]any)
	a, b := nodes[0].(map[string]any), nodes[1].(map[string]any)
	if a["bound"] != false || a["tenant"] != "" || a["host_nqn"] == "" || b["bound"] != true || b["tenant"] != "globex" {
		t.Fatalf("node bindings = %v", nodes)
	}
	if r["job"].(map[string]any)["expires_at"] != "2030-03-17T17:46:40Z" {
		t.Fatalf("job = %v", r["job"])
	}
}

func make64(c byte) []byte {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return b
}
