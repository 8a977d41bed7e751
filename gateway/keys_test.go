package gateway_test

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/nvmegate/nvmegate/audit"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func TestKeysRotateAndStatus(t *testing.T) {
	g := startGateway(t)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	for _, err := range []error{
		func() error { _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); return err }(),
		func() error {
			_, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()})
			return err
		}(),
		func() error {
			_, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	kc := pb.NewKeysClient(g.client(t, admin))
	st, err := kc.Status(ctx, &pb.KeysStatusRequest{})
	if err != nil || len(st.Keys) != 0 {
		t.Fatalf("status before any key: %v %v", st, err)
	}
	r1, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN, Reason: "test"})
	if err != nil || r1.Status.CurrentVersion != 1 {
		t.Fatalf("first rotation: %v %v", r1, err)
	}
	r2, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN})
	if err != nil || r2.Status.CurrentVersion != 2 || len(r2.Status.Versions) != 2 {
		t.Fatalf("second rotation: %v %v", r2, err)
	}
	old := r2.Status.Versions[1]
	if old.Version != 1 || old.SupersededAt == nil || old.ValidUntil == nil || !strings.HasPrefix(old.Fingerprint, "hmac-sha256:") ||
		r2.Status.NextRotation == nil {
		t.Fatalf("superseded version: %v", old)
	}
	d, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1})
	if err != nil || d.Status.CurrentVersion != 2 || d.Status.Nsid != 1 {
		t.Fatalf("data key rotation: %v %v", d, err)
	}
	st, err = kc.Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN})
	if err != nil || len(st.Keys) != 2 {
		t.Fatalf("status: %v %v", st, err)
	}
	// No key material in what the gateway answers. (The subsystem is on
	// an nvmet target: its hosts' keys derive from the target's root.)
	roots, err := g.keyStore.Roots(ctx, "target:stor-eu-1")
	if err != nil || len(roots) != 2 {
		t.Fatal(err)
	}
	js := protojson.Format(st) + protojson.Format(r2)
	for _, r := range roots {
		for _, enc := range []string{hex.EncodeToString(r.Secret), base64.StdEncoding.EncodeToString(r.Secret)} {
			if strings.Contains(js, enc) {
				t.Fatal("a root is in a Keys response")
			}
		}
	}

	_, err = kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN + "-absent"})
	wantCode(t, err, codes.NotFound)
	_, err = pb.NewKeysClient(g.client(t, node)).Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN})
	wantCode(t, err, codes.PermissionDenied)
	_, err = kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN, Nsid: 3})
	wantCode(t, err, codes.InvalidArgument, "nsid")

	// Every rotation request is in the audit log before it happened: the
	// three that succeeded, and the one for a subsystem that does not
	// exist with the entry saying it failed. (The node's is a deny entry;
	// the malformed one never got past validation.)
	// The key manager's own entries (the gateway's, intent and outcome of
	// each rotation that happened) come beside them.
	var (
		failed  int
		got     []audit.Entry
		ownDone int
	)
	for _, e := range queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"key_rotation"}}) {
		if e.Caller == "spiffe://nvmegate.test/gateway/test" {
			if strings.Contains(e.Detail, " rotated to v") {
				ownDone++
			}
			continue
		}
		got = append(got, e)
	}
	if ownDone == 0 {
		t.Error("no rotation outcome from the key manager in the log")
	}
	for _, e := range got {
		if e.Kind != audit.EventKeyRotation || !strings.HasPrefix(e.Detail, "keys.rotate ") || !strings.Contains(e.Detail, subNQN) ||
			e.Decision == nil || !e.Decision.Allow {
			t.Errorf("entry %q", e.Detail)
		}
		if strings.Contains(e.Detail, " failed (") {
			failed++
		}
	}
	if got[2].Detail != "keys.rotate data_key "+subNQN+"/1" {
		t.Errorf("data key entry %q names the class and namespace", got[2].Detail)
	}
	if len(got) != 5 || failed != 1 {
		t.Fatalf("%d key_rotation entries (%d failed), want 5 (1)", len(got), failed)
	}
}

// A data-key rotation by re-encryption is refused while the subsystem has
// an active grant (it takes the namespace offline), for a namespace
// nvmegate does not encrypt, for an access root and to a node; a
// re-encryption report is refused to anyone but the target's agent on its
// live stream.
func TestReencryptRefusals(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	kc := pb.NewKeysClient(g.client(t, admin))
	reenc := &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1, Reencrypt: true}
	_, err := kc.Rotate(ctx, reenc)
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "not encrypted at rest") {
		t.Errorf("a namespace without a backing device: %v", err)
	}
	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test" + node, HostNqn: hostNQN, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	_, err = kc.Rotate(ctx, reenc)
	wantCode(t, err, codes.FailedPrecondition)
	if !strings.Contains(err.Error(), "1 active grant") {
		t.Errorf("with an active grant: %v", err)
	}
	_, err = kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: subNQN, Reencrypt: true})
	wantCode(t, err, codes.InvalidArgument)
	_, err = pb.NewKeysClient(g.client(t, node)).Rotate(ctx, reenc)
	wantCode(t, err, codes.PermissionDenied)
	if st, err := kc.Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_DATA_KEY}); err != nil {
		t.Fatal(err)
	} else {
		for _, k := range st.Keys {
			if k.ReencryptingTo != 0 {
				t.Fatalf("a refused re-encryption began: %v", k)
			}
		}
	}

	report := &pb.ReencryptedRequest{SubsystemNqn: subNQN, Nsid: 1, Generation: 2, StreamId: "made-up"}
	_, err = pb.NewTargetAgentClient(g.client(t, admin)).Reencrypted(ctx, report)
	wantCode(t, err, codes.PermissionDenied)
	ta := pb.NewTargetAgentClient(g.client(t, "/target/stor-eu-1"))
	_, err = ta.Reencrypted(ctx, report) // no live stream of its own
	wantCode(t, err, codes.FailedPrecondition)
	_, err = ta.Reencrypted(ctx, &pb.ReencryptedRequest{SubsystemNqn: subNQN, Nsid: 1, Generation: 1, StreamId: "x"})
	wantCode(t, err, codes.InvalidArgument)
}
