package gateway_test

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/lineage"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The scheduler's API as Slurm's hooks use it: nodes named by a hostlist,
// a requeued job admitted again as its next generation (the run before
// ends first, with its grants), a late epilog of the earlier run changing
// nothing, and an elastic job losing a node whose grant then ends and
// whose host the target stops allowing.
func TestSchedulerStory(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	jc := pb.NewJobsClient(g.client(t, sched))
	gpu1, gpu2 := "spiffe://nvmegate.test/node/acme-gpu-1", "spiffe://nvmegate.test/node/acme-gpu-2"

	req := admitRequest("4242")
	req.Nodes, req.Hostlist, req.User = nil, "acme-gpu-[1-2]", "alice"
	adm, err := jc.Admit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(adm.Job.Nodes, []string{gpu1, gpu2}) || adm.Job.Generation != 0 || adm.Job.User != "alice" {
		t.Fatalf("admitted %v", adm.Job)
	}
	connect := func(who string) (*pb.ConnectResponse, error) {
		return pb.NewAccessClient(g.client(t, who)).Connect(ctx, &pb.ConnectRequest{JobId: "4242", SubsystemNqn: subNQN})
	}
	first, err := connect(node)
	if err != nil {
		t.Fatal(err)
	}

	// The requeue: generation 1 of the same scope. Run 0's grant ends
	// before run 1 is admitted.
	req1 := admitRequest("4242")
	req1.Nodes, req1.Hostlist, req1.User, req1.Generation, req1.ExpiresAt = nil, "acme-gpu-[1-2]", "alice", 1, req.ExpiresAt
	adm1, err := jc.Admit(ctx, req1)
	if err != nil {
		t.Fatal(err)
	}
	if adm1.Job.Generation != 1 || adm1.Job.State != pb.JobState_JOB_STATE_ACTIVE || adm1.Job.DecisionId == adm.Job.DecisionId {
		t.Fatalf("generation 1: %v", adm1.Job)
	}
	active, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "4242", State: pb.GrantState_GRANT_STATE_ACTIVE})
	if err != nil || len(active.Grants) != 0 {
		t.Fatalf("active grants after the requeue: %v, %v; want none (run 0's %s revoked)", active, err, first.Grant.GrantId)
	}
	// A late epilog of run 0 names generation 0: nothing changes.
	zero := uint32(0)
	late, err := jc.Finish(ctx, &pb.FinishRequest{JobId: "4242", Generation: &zero})
	if err != nil || !late.Unchanged || late.Job.Generation != 1 || late.Job.State != pb.JobState_JOB_STATE_ACTIVE || len(late.EndedGrantIds) != 0 {
		t.Fatalf("a late finish of generation 0: %v, %v", late, err)
	}
	// So does a late admission of run 0.
	_, err = jc.Admit(ctx, req)
	wantCode(t, err, codes.FailedPrecondition, "at generation 1: generation 0 is over")

	// The elastic part: gpu-2 connects, then leaves the job.
	second, err := connect("/node/acme-gpu-2")
	if err != nil {
		t.Fatal(err)
	}
	one := uint32(1)
	upd, err := jc.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "4242", Generation: &one, RemoveHostlist: "acme-gpu-2"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(upd.Job.Nodes, []string{gpu1}) || !slices.Equal(upd.EndedGrantIds, []string{second.Grant.GrantId}) || !upd.Decision.Allow {
		t.Fatalf("gpu-2 removed: %v", upd)
	}
	host := filepath.Join(g.configfs, "stor-eu-1", "subsystems", subNQN, "allowed_hosts", second.Grant.HostNqn)
	if _, err := os.Lstat(host); !os.IsNotExist(err) {
		t.Fatalf("the target still allows gpu-2's host after it left the job (%v)", err)
	}
	_, err = connect("/node/acme-gpu-2")
	wantCode(t, err, codes.PermissionDenied)
	if _, err := connect(node); err != nil {
		t.Fatalf("gpu-1, still in the job: %v", err)
	}
	// Adding it back lets it in again.
	if _, err := jc.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "4242", AddNodes: []string{gpu2}}); err != nil {
		t.Fatal(err)
	}
	if _, err := connect("/node/acme-gpu-2"); err != nil {
		t.Fatalf("gpu-2 added back: %v", err)
	}

	// The lineage of the run: its generation, user and nodes, and only
	// the entries from its admission on (run 0's grant is not among them).
	lin, err := pb.NewAuditClient(g.client(t, auditor)).Lineage(ctx, &pb.LineageRequest{JobId: "4242"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := lineage.Verify(lin.Envelope, []attest.PublicKey{g.auditKey})
	if err != nil || rep.Generation != 1 || rep.User != "alice" || !slices.Equal(rep.Nodes, []string{gpu1, gpu2}) {
		t.Fatalf("lineage of generation 1: %+v, %v", rep, err)
	}
	var pred lineage.Predicate
	if _, _, err := attest.OpenPredicate(lin.Envelope, lineage.PredicateType, []attest.PublicKey{g.auditKey}, &pred); err != nil {
		t.Fatal(err)
	}
	grants := 0
	for _, le := range pred.Entries {
		raw, err := base64.StdEncoding.DecodeString(le.Entry)
		if err != nil {
			t.Fatal(err)
		}
		e, err := audit.DecodeEntry(raw)
		if err != nil {
			t.Fatal(err)
		}
		if e.GrantID == first.Grant.GrantId {
			t.Fatalf("run 0's grant is in run 1's lineage: entry %d %s %q", le.Index, e.Kind, e.Detail)
		}
		if e.Kind == audit.EventGrant {
			grants++
		}
	}
	if grants == 0 {
		t.Fatal("run 1's lineage names none of its grants")
	}

	// Each run's admission and end is in the log, apart.
	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{JobId: "4242"})
	var details []string
	for _, e := range entries {
		if strings.HasPrefix(string(e.Kind), "job_") {
			details = append(details, fmt.Sprintf("%s %s", e.Kind, e.Detail))
		}
	}
	want := []string{
		"job_admit jobs.admit 4242",
		"job_finish job 4242 generation 0 finished: generation 1 admitted",
		"job_admit jobs.admit 4242 generation 1",
		"job_finish jobs.finish 4242 generation 1",
		"job_admit jobs.admit 4242",
		"job_admit jobs.admit 4242 failed (conflict)",
		"job_nodes jobs.update_nodes 4242 generation 1",
		"job_nodes jobs.update_nodes 4242 generation 1",
	}
	if !slices.Equal(details, want) {
		t.Fatalf("job entries:\n%s\nwant\n%s", strings.Join(details, "\n"), strings.Join(want, "\n"))
	}
}

// What a scheduler cannot do with the API made for it: touch another
// tenant's job, add a node bound to another tenant, change a finished
// job, or name hosts by a malformed hostlist.
func TestSchedulerRefusals(t *testing.T) {
	g, ctx := admittedGateway(t)
	jc := pb.NewJobsClient(g.client(t, sched))
	other := pb.NewJobsClient(g.client(t, "/tenant/globex/scheduler/slurm"))
	_, err := other.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "job-1", AddNodes: []string{"spiffe://nvmegate.test/node/globex-gpu-1"}})
	wantCode(t, err, codes.PermissionDenied)
	_, err = other.Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	wantCode(t, err, codes.PermissionDenied)

	if _, err := pb.NewInventoryClient(g.client(t, admin)).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{
		SpiffeId: "spiffe://nvmegate.test/node/globex-gpu-1", HostNqn: hostNQN, Tenant: "globex"}}); err != nil {
		t.Fatal(err)
	}
	_, err = jc.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "job-1", AddNodes: []string{"spiffe://nvmegate.test/node/globex-gpu-1"}})
	wantCode(t, err, codes.PermissionDenied, "bound to another tenant")

	for _, c := range []struct {
		r    *pb.UpdateNodesRequest
		want string
	}{
		{&pb.UpdateNodesRequest{JobId: "job-1"}, "add_nodes"},
		{&pb.UpdateNodesRequest{JobId: "job-1", AddHostlist: "gpu[3-1]"}, "add_hostlist"},
		{&pb.UpdateNodesRequest{JobId: "job-1", AddNodes: []string{"spiffe://nvmegate.test/node/x"}, RemoveHostlist: "x"}, "both added and removed"},
		{&pb.UpdateNodesRequest{JobId: "job-1", AddHostlist: "n[0-999999999]"}, "too many hosts"},
	} {
		_, err := jc.UpdateNodes(ctx, c.r)
		wantCode(t, err, codes.InvalidArgument, c.want)
	}
	bad := admitRequest("job-2")
	bad.Hostlist = "gpu[1-2]-x"
	_, err = jc.Admit(ctx, bad)
	wantCode(t, err, codes.InvalidArgument, "hostlist")

	two := uint32(2)
	_, err = jc.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "job-1", Generation: &two, RemoveNodes: []string{"spiffe://nvmegate.test/node/acme-gpu-2"}})
	wantCode(t, err, codes.FailedPrecondition, "at generation 0, not 2")
	if _, err := jc.Finish(ctx, &pb.FinishRequest{JobId: "job-1"}); err != nil {
		t.Fatal(err)
	}
	_, err = jc.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: "job-1", RemoveNodes: []string{"spiffe://nvmegate.test/node/acme-gpu-2"}})
	wantCode(t, err, codes.FailedPrecondition, "is finished")
}

// Another tenant's scheduler naming an active job's ID, as a later
// generation of a job of its own tenant: policy allows globex's admission
// of globex's data, and the gateway must neither end acme's run nor take
// its ID.
func TestAdmissionCannotTakeAnotherTenantsJob(t *testing.T) {
	g, ctx := admittedGateway(t)
	if _, err := pb.NewAccessClient(g.client(t, node)).Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: subNQN}); err != nil {
		t.Fatal(err)
	}
	inv := pb.NewInventoryClient(g.client(t, admin))
	globexSub := "nqn.2026-01.io.nvmegate.test:globex-train"
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: globexSub, TargetId: "stor-eu-1", Tenant: "globex", PortIds: []uint32{1}, Dhchap: true}}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: globexSub, Nsid: 1, Tenant: "globex", Region: "eu-west",
		DataClass: "internal", Dataset: &pb.Dataset{Name: "globex/data", Digest: digest}}}); err != nil {
		t.Fatal(err)
	}
	req := &pb.AdmitRequest{JobId: "job-1", Tenant: "globex", Generation: 7, Nodes: []string{"spiffe://nvmegate.test/node/globex-gpu-1"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: globexSub, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: admitRequest("x").ExpiresAt}
	_, err := pb.NewJobsClient(g.client(t, "/tenant/globex/scheduler/slurm")).Admit(ctx, req)
	wantCode(t, err, codes.AlreadyExists, `job ID "job-1" is taken`)
	if strings.Contains(status.Convert(err).Message(), "acme") {
		t.Fatalf("the refusal names the other tenant: %v", err)
	}
	got, err := pb.NewJobsClient(g.client(t, sched)).Get(ctx, &pb.JobsGetRequest{JobId: "job-1"})
	if err != nil || got.Job.Tenant != "acme" || got.Job.State != pb.JobState_JOB_STATE_ACTIVE || got.Job.Generation != 0 {
		t.Fatalf("acme's job after globex's attempt: %v, %v", got, err)
	}
	active, err := pb.NewAccessClient(g.client(t, admin)).ListGrants(ctx, &pb.ListGrantsRequest{JobId: "job-1", State: pb.GrantState_GRANT_STATE_ACTIVE})
	if err != nil || len(active.Grants) != 1 {
		t.Fatalf("acme's grant after globex's attempt: %v, %v", active, err)
	}
	// Acme's lineage holds none of globex's calls under the same ID.
	fin, err := pb.NewJobsClient(g.client(t, sched)).Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	if err != nil {
		t.Fatal(err)
	}
	var pred lineage.Predicate
	if _, _, err := attest.OpenPredicate(fin.Lineage, lineage.PredicateType, []attest.PublicKey{g.auditKey}, &pred); err != nil {
		t.Fatal(err)
	}
	for _, le := range pred.Entries {
		raw, _ := base64.StdEncoding.DecodeString(le.Entry)
		e, err := audit.DecodeEntry(raw)
		if err != nil {
			t.Fatal(err)
		}
		if e.Tenant == "globex" || strings.Contains(e.Caller, "globex") {
			t.Fatalf("globex's call is in acme's lineage: entry %d %s %q", le.Index, e.Kind, e.Detail)
		}
	}
	if len(pred.Entries) == 0 {
		t.Fatal("acme's lineage is empty")
	}
}

// A call refused on a job resource without a job (a list) is recorded as
// a refusal, not answered Internal.
func TestJobListRefusedAndRecorded(t *testing.T) {
	g, ctx := admittedGateway(t)
	_, err := pb.NewJobsClient(g.client(t, node)).List(ctx, &pb.JobsListRequest{Tenant: "acme"})
	wantCode(t, err, codes.PermissionDenied)
	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"deny"}})
	if len(entries) != 1 || entries[0].Detail != "jobs.list" {
		t.Fatalf("deny entries %+v, want the refused jobs.list", entries)
	}
}
