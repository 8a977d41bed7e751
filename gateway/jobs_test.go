package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/audit"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func admitRequest(id string) *pb.AdmitRequest {
	return &pb.AdmitRequest{JobId: id, Tenant: "acme",
		Nodes:          []string{"spiffe://nvmegate.test" + node, "spiffe://nvmegate.test/node/acme-gpu-2"},
		Namespaces:     []*pb.JobNamespace{{SubsystemNqn: subNQN, Nsid: 1, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}},
		AllowedRegions: []string{"eu-west"}, ExpiresAt: timestamppb.New(time.Now().Add(2 * time.Hour))}
}

// admittedGateway is a gateway with acme's inventory and job-1 admitted
// (admitRequest), and a context for the test's calls.
func admittedGateway(t *testing.T, opts ...gatewayOption) (*testGateway, context.Context) {
	t.Helper()
	g := startGateway(t, opts...)
	acmeInventory(t, g)
	ctx := ctxT(t)
	if _, err := pb.NewJobsClient(g.client(t, sched)).Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatal(err)
	}
	return g, ctx
}

// acmeInventory registers a target, acme's subsystem and namespace 1.
func acmeInventory(t testing.TB, g *testGateway) {
	t.Helper()
	inv := pb.NewInventoryClient(g.client(t, admin))
	ctx := ctxT(t)
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()}); err != nil {
		t.Fatal(err)
	}
	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: validNamespace()}); err != nil {
		t.Fatal(err)
	}
}

// A scheduler admits, reads, lists and finishes its tenant's job; another
// tenant's scheduler can do none of it; every admission and finish is in
// the audit log before it happened, with the job's namespaces, datasets
// and expiry.
func TestJobsLifecycle(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	jc := pb.NewJobsClient(g.client(t, sched))

	first := admitRequest("job-1")
	resp, err := jc.Admit(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	j := resp.Job
	if j.State != pb.JobState_JOB_STATE_ACTIVE || j.Scheduler != "spiffe://nvmegate.test"+sched || j.DecisionId != resp.Decision.Id ||
		!resp.Decision.Allow || j.AdmittedAt == nil {
		t.Fatalf("admitted: %v", resp)
	}
	// The same admission again (a scheduler's retry) answers the job as
	// stored; another scope under the same ID is refused, saying how.
	again, err := jc.Admit(ctx, first)
	if err != nil || again.Job.DecisionId != j.DecisionId || !again.Job.AdmittedAt.AsTime().Equal(j.AdmittedAt.AsTime()) {
		t.Fatalf("the same admission again: %v, %v; want the job as stored", again, err)
	}
	changed := admitRequest("job-1")
	changed.Nodes = changed.Nodes[:1]
	_, err = jc.Admit(ctx, changed)
	wantCode(t, err, codes.AlreadyExists, "already admitted with another scope", "1 node(s) missing")

	got, err := jc.Get(ctx, &pb.JobsGetRequest{JobId: "job-1"})
	if err != nil || got.Job.JobId != "job-1" || len(got.Job.Namespaces) != 1 {
		t.Fatalf("get: %v %v", got, err)
	}
	list, err := jc.List(ctx, &pb.JobsListRequest{Tenant: "acme", State: pb.JobState_JOB_STATE_ACTIVE})
	if err != nil || len(list.Jobs) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}

	// Another tenant's scheduler: no admit for acme, no reading acme's job.
	other := pb.NewJobsClient(g.client(t, "/tenant/globex/scheduler/slurm"))
	_, err = other.Admit(ctx, admitRequest("job-2"))
	wantCode(t, err, codes.PermissionDenied)
	_, err = other.Get(ctx, &pb.JobsGetRequest{JobId: "job-1"})
	wantCode(t, err, codes.PermissionDenied)
	_, err = other.Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	wantCode(t, err, codes.PermissionDenied)
	// A job whose namespace is not the tenant's is refused by policy.
	bad := admitRequest("job-3")
	bad.Namespaces[0].Nsid = 7
	_, err = jc.Admit(ctx, bad)
	wantCode(t, err, codes.PermissionDenied)

	fin, err := jc.Finish(ctx, &pb.FinishRequest{JobId: "job-1", Reason: "done"})
	if err != nil || fin.Job.State != pb.JobState_JOB_STATE_FINISHED || fin.Job.FinishedAt == nil {
		t.Fatalf("finish: %v %v", fin, err)
	}
	// Finishing again answers the job as it is: an epilog may retry.
	fin2, err := jc.Finish(ctx, &pb.FinishRequest{JobId: "job-1"})
	if err != nil || !fin2.Unchanged || fin2.Job.State != pb.JobState_JOB_STATE_FINISHED || !fin2.Job.FinishedAt.AsTime().Equal(fin.Job.FinishedAt.AsTime()) {
		t.Fatalf("finish again: %v, %v", fin2, err)
	}

	// No host got credentials, so no root had to rotate (grants: access_test).
	st, err := pb.NewKeysClient(g.client(t, admin)).Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT})
	if err != nil || len(st.Keys) != 0 || len(fin.EndedGrantIds) != 0 {
		t.Fatalf("root after finish: %v %v; ended %v", st, err, fin.EndedGrantIds)
	}

	entries := queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{JobId: "job-1"})
	var kinds []string
	for _, e := range entries {
		kinds = append(kinds, string(e.Kind))
	}
	// admitted (its entry recorded with the job); the same admission
	// again (recorded, no change); another scope (recorded, then its
	// failure); two refusals of globex's scheduler; finished, then the
	// job stored as finished (a finish ends grants too: its entry comes
	// first); finished again (recorded, nothing changed).
	want := "job_admit,job_admit,job_admit,job_admit,deny,deny,job_finish,state_change,job_finish"
	if strings.Join(kinds, ",") != want {
		t.Fatalf("job-1 entries %v, want %s", kinds, want)
	}
	a := entries[0]
	if a.Tenant != "acme" || a.ExpiresAt.IsZero() || len(a.Namespaces) != 1 || a.Namespaces[0].Dataset != "common-crawl/2026-10" ||
		a.Namespaces[0].Mode != "ro" || a.Decision == nil || a.Decision.ID != j.DecisionId {
		t.Fatalf("admission entry %+v", a)
	}
	if entries[0].Change == nil {
		t.Errorf("the admission's entry does not carry the change that stored the job: %+v", entries[0])
	}
	if entries[1].Detail != "jobs.admit job-1" || entries[1].Change != nil || entries[3].Detail != "jobs.admit job-1 failed (exists)" {
		t.Errorf("repeated admission entries %+v, %+v", entries[1], entries[3])
	}
	if entries[6].Kind != audit.EventJobFinish || entries[7].Detail != "job job-1 finished" || entries[8].Detail != "jobs.finish job-1" || entries[8].Change != nil {
		t.Errorf("finish entries %q / %q / %q", entries[6].Detail, entries[7].Detail, entries[8].Detail)
	}
}

// Only node identities may be a job's nodes: a scheduler naming an
// admin, another scheduler, a target or its trust domain gets
// InvalidArgument naming the entry, and no job is stored.
func TestAdmitRefusesNonNodeIdentities(t *testing.T) {
	g := startGateway(t)
	acmeInventory(t, g)
	ctx := ctxT(t)
	jc := pb.NewJobsClient(g.client(t, sched))
	for _, id := range []string{
		"spiffe://nvmegate.test/admin/ops",
		"spiffe://nvmegate.test/tenant/acme/scheduler/slurm",
		"spiffe://nvmegate.test/target/stor-eu-1",
		"spiffe://nvmegate.test/gateway/g1",
		"spiffe://nvmegate.test/node/acme-gpu-9/extra",
	} {
		req := admitRequest("job-1")
		req.Nodes = append(req.Nodes, id)
		_, err := jc.Admit(ctx, req)
		wantCode(t, err, codes.InvalidArgument, "nodes[2]", id, "/node/<host>")
	}
	// Nothing was stored: the same job with node identities only is new.
	if _, err := jc.Admit(ctx, admitRequest("job-1")); err != nil {
		t.Fatalf("the same job with node identities only: %v", err)
	}
}

// Another tenant's scheduler cannot tell an existing job from one that
// does not exist: Get and Finish of acme's job and of an unknown ID are
// refused alike, reason for reason.
func TestJobsDoNotLeakExistence(t *testing.T) {
	g, ctx := admittedGateway(t)
	jc := pb.NewJobsClient(g.client(t, "/tenant/globex/scheduler/s"))
	refusal := func(call func(id string) error, id string) string {
		err := call(id)
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%s: %v", id, err)
		}
		msg := status.Convert(err).Message()
		msg, _, _ = strings.Cut(msg, "; decision ")
		return strings.ReplaceAll(msg, id, "<job>")
	}
	for name, call := range map[string]func(id string) error{
		"get":    func(id string) error { _, err := jc.Get(ctx, &pb.JobsGetRequest{JobId: id}); return err },
		"finish": func(id string) error { _, err := jc.Finish(ctx, &pb.FinishRequest{JobId: id}); return err },
	} {
		if known, unknown := refusal(call, "job-1"), refusal(call, "job-404"); known != unknown {
			t.Errorf("%s: acme's job refused with %q, an unknown one with %q", name, known, unknown)
		}
	}
	if _, err := pb.NewJobsClient(g.client(t, sched)).Get(ctx, &pb.JobsGetRequest{JobId: "job-1"}); err != nil {
		t.Fatalf("acme's own scheduler: %v", err)
	}
}
