package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// Issue 29, defect 5: one encrypted namespace its target cannot open
// stalled every tenant on the target. Here acme's namespace has a backing
// device, and the target's agent has no cryptsetup (an nvmet driver with no
// Crypt, on a temporary configfs tree); globex has a subsystem of its own on
// the same target. globex's connect succeeds with its host on the target,
// acme's too; a release on either subsystem takes its host off the target
// at once; acme's namespace is not exported (never in the clear), and the
// gateway says so (Agent.NotServed, nvmegate_target_namespaces_not_served).
func TestNamespaceNotServedStallsNoTenant(t *testing.T) {
	const globexNQN = "nqn.2026-01.io.nvmegate.test:globex-train"
	const globexSched, globexNode = "/tenant/globex/scheduler/slurm", "/node/globex-gpu-1"
	g := startGateway(t)
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	enc := validNamespace()
	enc.BackingDevice = "/dev/nvmegate-test0"
	gsub := validSubsystem()
	gsub.Nqn, gsub.Tenant = globexNQN, "globex"
	gns := validNamespace()
	gns.SubsystemNqn, gns.Tenant = globexNQN, "globex"
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}))
	must(inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}))
	must(inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: enc}))
	must(inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: gsub}))
	must(inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: gns}))
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	if _, err := pb.NewJobsClient(g.client(t, globexSched)).Admit(ctx, &pb.AdmitRequest{JobId: "job-g", Tenant: "globex",
		Nodes:          []string{"spiffe://nvmegate.test" + globexNode},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: globexNQN, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(2 * time.Hour))}); err != nil {
		t.Fatal(err)
	}

	// The target's own agent, without cryptsetup.
	root := t.TempDir()
	g.remote.Store("stor-eu-1", true)
	var (
		mu      sync.Mutex
		reports []error // what each generation applied came with
	)
	applied := make(chan uint64, 100)
	r := &targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"), Driver: &nvmet.Driver{Root: root}, Applied: func(gen uint64, err error) {
		if _, partial := fabric.NotServedIn(err); err == nil || partial {
			mu.Lock()
			reports = append(reports, err)
			mu.Unlock()
			applied <- gen
		}
	}}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(rctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	waitApplied(t, applied)

	nsDir := filepath.Join(root, "subsystems", subNQN, "namespaces", "1")
	onTarget := func(sub, host string) bool {
		_, err := os.Lstat(filepath.Join(root, "subsystems", sub, "allowed_hosts", host))
		return err == nil
	}
	// globex's connect, to its own subsystem, is answered: its host is on
	// the target.
	gc, err := pb.NewAccessClient(g.client(t, globexNode)).Connect(ctx, &pb.ConnectRequest{JobId: "job-g", SubsystemNqn: globexNQN})
	if err != nil {
		t.Fatalf("another tenant's connect on the target: %v", err)
	}
	if !onTarget(globexNQN, gc.Grant.HostNqn) {
		t.Fatal("globex's host is not on the target after its connect was answered")
	}
	// acme's, to the subsystem of the namespace not served, too.
	ac, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN})
	if err != nil {
		t.Fatalf("a connect beside the namespace not served: %v", err)
	}
	if !onTarget(subNQN, ac.Grant.HostNqn) {
		t.Fatal("acme's host is not on the target after its connect was answered")
	}
	if _, err := os.Stat(nsDir); !os.IsNotExist(err) {
		t.Fatalf("the namespace to encrypt is exported without encryption: %v", err)
	}

	// Releases on either subsystem take the host off the target before
	// they are answered: nothing is left "removal pending".
	if _, err := pb.NewAccessClient(g.client(t, globexNode)).Release(ctx, &pb.ReleaseRequest{GrantId: gc.Grant.GrantId}); err != nil {
		t.Fatalf("globex's release: %v", err)
	}
	if onTarget(globexNQN, gc.Grant.HostNqn) {
		t.Fatal("globex's released host is still on the target")
	}
	if _, err := pb.NewAccessClient(g.client(t, node)).Release(ctx, &pb.ReleaseRequest{GrantId: ac.Grant.GrantId}); err != nil {
		t.Fatalf("acme's release: %v", err)
	}
	if onTarget(subNQN, ac.Grant.HostNqn) {
		t.Fatal("acme's released host is still on the target")
	}
	for _, h := range []string{gc.Grant.HostNqn, ac.Grant.HostNqn} {
		if _, err := os.Stat(filepath.Join(root, "hosts", h)); !os.IsNotExist(err) {
			t.Fatalf("released host %s still has its entry: %v", h, err)
		}
	}
	if n := g.db.PendingRemovalCount(); n != 0 {
		t.Fatalf("%d grants removal pending", n)
	}

	// The gateway knows, and says only this namespace is not served.
	ns := g.agent.NotServed()["stor-eu-1"]
	if len(ns) != 1 || ns[0].Subsystem != subNQN || ns[0].NSID != 1 || !strings.Contains(ns[0].Reason, "no dm-crypt") {
		t.Fatalf("namespaces not served, as the gateway has them: %v", ns)
	}
	mu.Lock()
	first := reports[0]
	mu.Unlock()
	if got, _ := fabric.NotServedIn(first); len(got) != 1 {
		t.Fatalf("the agent's first state: %v", first)
	}
	if _, err := os.Stat(nsDir); !os.IsNotExist(err) {
		t.Fatalf("the namespace to encrypt is exported without encryption: %v", err)
	}
}
