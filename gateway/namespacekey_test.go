package gateway_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/nvmegate/nvmegate/gateway"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// Issue 29, defect 4: a namespace removed without erase, its subsystem
// removed and added again for another tenant, and the namespace added
// again under the same NQN and NSID. The new tenant must never get the
// old tenant's data key: the add is refused while the old key is stored,
// the plain remove said the key was kept, an erase frees the name, and
// the namespace added after it has a key of its own.
func TestNamespaceReaddedNeverInheritsItsDataKey(t *testing.T) {
	g := startGateway(t)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	kc := pb.NewKeysClient(g.client(t, admin))
	ns := validNamespace()
	ns.BackingDevice = "/dev/nvmegate-test0"
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	// acme's data key: made by a rotation (as by its target's first state).
	if _, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	name := gateway.NamespaceKeyName(subNQN, 1)
	old, err := g.keyStore.DataKey(ctx, name)
	if err != nil || old.Owner == "" {
		t.Fatalf("acme's data key: %+v %v (want one bound to its record)", old, err)
	}
	oldKey, err := g.keyStore.Unwrap(ctx, name, old.Wrapped)
	if err != nil {
		t.Fatal(err)
	}

	rm, err := inv.RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rm.DataKey, "kept:") || !strings.Contains(rm.DataKey, "--erase") {
		t.Fatalf("a plain remove says of the key %q; want what becomes of it", rm.DataKey)
	}
	if _, err := inv.RemoveSubsystem(ctx, &pb.RemoveSubsystemRequest{Nqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	sub := validSubsystem()
	sub.Tenant = "globex"
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: sub}); err != nil {
		t.Fatal(err)
	}
	ns.Tenant = "globex"
	_, err = inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns})
	wantCode(t, err, codes.FailedPrecondition, "removed without erase", "--erase")
	_, err = inv.GetNamespace(ctx, &pb.GetNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1})
	wantCode(t, err, codes.NotFound)

	// Erase on the removed namespace frees the name.
	er, err := inv.RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1, Erase: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(er.DataKey, "destroyed:") {
		t.Fatalf("erase says of the key %q", er.DataKey)
	}
	if _, err := g.keyStore.Unwrap(ctx, name, old.Wrapped); err == nil {
		t.Fatal("acme's data key unwraps after the erase")
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	cur, err := g.keyStore.DataKey(ctx, name)
	if err != nil || cur.Owner == "" || cur.Owner == old.Owner {
		t.Fatalf("globex's data key: %+v %v (want its own record's)", cur, err)
	}
	newKey, err := g.keyStore.Unwrap(ctx, name, cur.Wrapped)
	if err != nil || bytes.Equal(newKey, oldKey) {
		t.Fatalf("globex's data key is acme's, or %v", err)
	}
	st, err := kc.Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_DATA_KEY})
	if err != nil || len(st.Keys) != 1 || st.Keys[0].DataKeyGeneration != 1 {
		t.Fatalf("keys status: %v %v", st, err)
	}
}

// A key left by a plain remove and still present when a namespace of the
// same name is added (the check at add raced the removal, or the key store
// was away then) is still not given to the new record: keys status says it
// has none, and the target is given no key.
func TestForeignDataKeyNotReported(t *testing.T) {
	g := startGateway(t)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	ns := validNamespace()
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	// A key made for another record of this name.
	if _, err := g.keyStore.CreateDataKey(ctx, gateway.NamespaceKeyName(subNQN, 1), "an-earlier-record"); err != nil {
		t.Fatal(err)
	}
	kc := pb.NewKeysClient(g.client(t, admin))
	st, err := kc.Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_DATA_KEY})
	if err != nil || len(st.Keys) != 0 {
		t.Fatalf("keys status reports another record's key as this namespace's: %v %v", st, err)
	}
	_, err = kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1, Reason: "test"})
	wantCode(t, err, codes.FailedPrecondition, "removed without erase")

	// The target's report of a re-encryption does not commit it.
	g.remote.Store("stor-eu-1", true)
	applied := make(chan struct{}, 10)
	r := &targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"), Driver: &recordingDriver{}, Applied: func(uint64, error) {
		select {
		case applied <- struct{}{}:
		default:
		}
	}}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Run(rctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-applied
	if _, err := g.keyStore.BeginDataKeyRotation(ctx, gateway.NamespaceKeyName(subNQN, 1)); err != nil {
		t.Fatal(err)
	}
	err = r.Reencrypted(ctx, subNQN, 1, 2, nil)
	wantCode(t, err, codes.FailedPrecondition, "belongs to another namespace record")
	if rec, err := g.keyStore.DataKey(ctx, gateway.NamespaceKeyName(subNQN, 1)); err != nil || rec.Gen() != 1 || rec.Next == nil {
		t.Fatalf("the other record's key after the report: %+v %v (want generation 1, the next one still under way)", rec, err)
	}

	// A plain remove says the key stored under the name is not its own.
	rm, err := inv.RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: subNQN, Nsid: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rm.DataKey, "none of this namespace's") {
		t.Fatalf("a plain remove over another record's key says %q", rm.DataKey)
	}
}
