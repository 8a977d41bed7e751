package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
)

func newJob(id, tenant string, ns ...nvmegate.JobNamespace) *nvmegate.Job {
	return &nvmegate.Job{ID: id, Tenant: tenant, Scheduler: "spiffe://example.org/tenant/" + tenant + "/scheduler/s",
		Nodes: []string{nodeID(1), nodeID(2)}, Namespaces: ns, AllowedRegions: []string{"eu-west"},
		ExpiresAt: t0.Add(24 * time.Hour), DecisionID: "d-1"}
}

func TestJobLifecycle(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	inventory(t, db, "acme", "globex")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "globex")))
	ro := nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly}

	j := newJob("job-1", "acme", ro)
	must(t, db.CreateJob(ctx, j))
	if j.State != nvmegate.JobActive || j.AdmittedAt.IsZero() || j.AdmittedAt.Location() != time.UTC {
		t.Fatalf("admitted job: %+v", j)
	}
	got, err := db.Job(ctx, "job-1")
	must(t, err)
	if !reflect.DeepEqual(got, j) {
		t.Fatalf("read back:\n%+v\nwant\n%+v", got, j)
	}

	again := newJob("job-1", "acme", ro)
	again.Nodes = []string{nodeID(2), nodeID(1)} // the order is no change
	rev0 := db.Revision()
	must(t, db.CreateJob(ctx, again))
	if again.ScopeDiff(j) != "" || !again.AdmittedAt.Equal(j.AdmittedAt) || again.State != nvmegate.JobActive || db.Revision() != rev0 {
		t.Fatalf("the same admission again:\n%+v\nwant the stored\n%+v", again, j)
	}
	other := newJob("job-1", "acme", ro)
	other.Nodes = append(other.Nodes, nodeID(3))
	e0 := wantError(t, db.CreateJob(ctx, other), nvmegate.EEXISTS, "")
	wantMessage(t, e0, "already admitted with another scope", "1 node(s) added", "n0003")
	e := wantError(t, db.CreateJob(ctx, newJob("job-2", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 9, Mode: "ro"})), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "not in the inventory")
	e = wantError(t, db.CreateJob(ctx, newJob("job-3", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(1), NSID: 1, Mode: "ro"})), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "not tenant acme's")
	wantError(t, db.CreateJob(ctx, newJob("", "acme", ro)), nvmegate.EINVALID, "job_id")

	fin, unchanged, err := db.FinishJob(ctx, "job-1", nil)
	must(t, err)
	if fin.State != nvmegate.JobFinished || fin.FinishedAt.IsZero() || unchanged {
		t.Fatalf("finished: %+v (unchanged %v)", fin, unchanged)
	}
	rev := db.Revision()
	again2, unchanged, err := db.FinishJob(ctx, "job-1", nil)
	if err != nil || !unchanged || !again2.FinishedAt.Equal(fin.FinishedAt) || db.Revision() != rev {
		t.Fatalf("finished again: %+v, unchanged %v, %v; revision %d, want %d", again2, unchanged, err, db.Revision(), rev)
	}
	wantMessage(t, wantError(t, db.CreateJob(ctx, newJob("job-1", "acme", ro)), nvmegate.EEXISTS, ""), "is finished", "generation 1")
	_, _, err = db.FinishJob(ctx, "nope", nil)
	wantError(t, err, nvmegate.ENOTFOUND, "")
}

// A requeued job is admitted again under its ID as the next generation,
// once the one before has ended; calls of an earlier run change nothing.
func TestJobGenerations(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	inventory(t, db, "acme", "globex")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "globex")))
	ro := nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly}
	gen := func(g uint32) *nvmegate.Job {
		j := newJob("12345", "acme", ro)
		j.Generation, j.User = g, "alice"
		return j
	}
	must(t, db.CreateJob(ctx, gen(0)))
	wantMessage(t, wantError(t, db.CreateJob(ctx, gen(1)), nvmegate.ECONFLICT, ""), "generation 0 is still active")
	// Another tenant never takes the ID, at any generation.
	theirs := newJob("12345", "globex", nvmegate.JobNamespace{SubsystemNQN: subNQN(1), NSID: 1, Mode: nvmegate.ModeReadOnly})
	theirs.Generation = 9
	wantMessage(t, wantError(t, db.CreateJob(ctx, theirs), nvmegate.EEXISTS, ""), `job ID "12345" is taken`)

	// The killed run's epilog names the next generation already.
	one := uint32(1)
	fin, unchanged, err := db.FinishJob(ctx, "12345", &one)
	if err != nil || unchanged || fin.Generation != 0 || fin.State != nvmegate.JobFinished {
		t.Fatalf("finish of generation 0 by its epilog: %+v, unchanged %v, %v", fin, unchanged, err)
	}
	j1 := gen(1)
	must(t, db.CreateJob(ctx, j1))
	if j1.Generation != 1 || j1.State != nvmegate.JobActive {
		t.Fatalf("generation 1: %+v", j1)
	}
	// A late call of run 0: neither its finish nor its admission touches run 1.
	zero := uint32(0)
	got, unchanged, err := db.FinishJob(ctx, "12345", &zero)
	if err != nil || !unchanged || got.Generation != 1 || got.State != nvmegate.JobActive {
		t.Fatalf("a late finish of generation 0: %+v, unchanged %v, %v", got, unchanged, err)
	}
	wantMessage(t, wantError(t, db.CreateJob(ctx, gen(0)), nvmegate.ECONFLICT, ""), "at generation 1: generation 0 is over")
	stored, err := db.Job(ctx, "12345")
	must(t, err)
	if stored.Generation != 1 || stored.User != "alice" || stored.State != nvmegate.JobActive {
		t.Fatalf("stored: %+v", stored)
	}
}

// A job past its expiry reads as expired; finishing it changes nothing.
func TestJobExpiry(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	j := newJob("job-1", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: "rw"})
	j.ExpiresAt = t0.Add(30 * time.Second) // the fake clock ticks a second per reading
	must(t, db.CreateJob(ctx, j))
	for range 40 {
		db.now()
	}
	got, err := db.Job(ctx, "job-1")
	must(t, err)
	if got.State != nvmegate.JobExpired || !got.FinishedAt.Equal(j.ExpiresAt) {
		t.Fatalf("past expiry: %s, finished %v", got.State, got.FinishedAt)
	}
	if got, unchanged, err := db.FinishJob(ctx, "job-1", nil); err != nil || !unchanged || got.State != nvmegate.JobExpired {
		t.Fatalf("finishing an expired job: %+v, unchanged %v, %v; want it unchanged", got, unchanged, err)
	}
	list, _, err := db.ListJobs(ctx, JobFilter{State: nvmegate.JobExpired}, Page{})
	must(t, err)
	if len(list) != 1 {
		t.Fatalf("expired jobs: %d", len(list))
	}
}

func TestListJobsFilterAndPages(t *testing.T) {
	db := openTestDB(t)
	noSync(db)
	ctx := context.Background()
	inventory(t, db, "acme", "globex")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(1), 1, "globex")))
	for i := range 300 { // 250 of acme, 50 of globex
		tenant, sub := "acme", subNQN(0)
		if i%6 == 0 {
			tenant, sub = "globex", subNQN(1)
		}
		j := newJob(fmt.Sprintf("job-%03d", i), tenant, nvmegate.JobNamespace{SubsystemNQN: sub, NSID: 1, Mode: "ro"})
		j.ExpiresAt = t0.Add(1000 * time.Hour)
		must(t, db.CreateJob(ctx, j))
	}
	_, _, err := db.FinishJob(ctx, "job-001", nil)
	must(t, err)
	checkPages(t, func(p Page) ([]string, string, error) {
		js, next, err := db.ListJobs(ctx, JobFilter{Tenant: "acme"}, p)
		return keysOf(js, func(j *nvmegate.Job) string { return j.ID }), next, err
	}, 250)
	active, _, err := db.ListJobs(ctx, JobFilter{Tenant: "acme", State: nvmegate.JobActive}, Page{Size: 100})
	must(t, err)
	if len(active) != 100 || active[0].ID != "job-002" {
		t.Fatalf("active acme jobs: %d, first %s; want a full page from job-002", len(active), active[0].ID)
	}
	if _, _, err := db.ListJobs(ctx, JobFilter{}, Page{Token: "garbage"}); err == nil {
		t.Fatal("bad token accepted")
	}
}

// A grant opened or renewed in a job that finished meanwhile is refused in
// its commit: the job's end revoked what was active when it committed, and
// a later grant would outlive it. Ending a grant of a finished job stays
// possible.
func TestGrantRefusedOnceItsJobFinished(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateJob(ctx, newJob("job-1", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly})))
	before := newGrant(1, subNQN(0))
	must(t, db.PutGrant(ctx, before))
	if _, _, err := db.FinishJob(ctx, "job-1", nil); err != nil {
		t.Fatal(err)
	}
	e := wantError(t, db.PutGrant(ctx, newGrant(2, subNQN(0))), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "job job-1 is finished")
	renewed := *before
	renewed.ExpiresAt = renewed.ExpiresAt.Add(time.Hour)
	wantError(t, db.PutGrant(ctx, &renewed), nvmegate.ECONFLICT, "")
	ended := *before
	ended.State = nvmegate.GrantRevoked
	must(t, db.PutGrant(ctx, &ended))
}

// Ended jobs leave the read model (a gateway admits jobs as long as it
// runs, and a job's node list can be 10,000 entries): the model keeps the
// active ones and the last maxEndedJobs ended, yet every job still reads
// as it is stored — from the file — and a grant for a long-finished job is
// still refused in its commit. A reopened store loads only the active
// ones.
func TestEndedJobsLeaveTheModel(t *testing.T) {
	dir := t.TempDir()
	db, err := Open(dir+"/s.db", Options{Now: func() time.Time { return t0 }})
	must(t, err)
	ctx := context.Background()
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	ro := nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly}
	const jobs, active = 100, 10
	for i := range jobs {
		id := fmt.Sprintf("job-%03d", i)
		must(t, db.CreateJob(ctx, newJob(id, "acme", ro)))
		if i >= active {
			_, _, err := db.FinishJob(ctx, id, nil)
			must(t, err)
		}
	}
	check := func(db *DB) {
		t.Helper()
		db.model.mu.RLock()
		inModel := len(db.model.jobs)
		db.model.mu.RUnlock()
		if inModel != active {
			t.Fatalf("%d jobs in the model, want the %d active", inModel, active)
		}
		for i := range jobs {
			id := fmt.Sprintf("job-%03d", i)
			j, err := db.Job(ctx, id)
			must(t, err)
			want := nvmegate.JobActive
			if i >= active {
				want = nvmegate.JobFinished
			}
			if j.State != want || len(j.Nodes) != 2 || len(j.Namespaces) != 1 {
				t.Fatalf("%s: %+v", id, j)
			}
		}
		if n := len(db.model.ended.m); n > maxEndedJobs {
			t.Fatalf("%d ended jobs kept", n)
		}
		_, err := db.Job(ctx, "job-none")
		wantError(t, err, nvmegate.ENOTFOUND, "")
	}
	check(db)
	// The first finished job was evicted from the ended ones long ago:
	// the commit reads its state from the file.
	db.model.ended.drop("job-010")
	g := newGrant(1, subNQN(0))
	g.JobID = "job-010"
	wantError(t, db.PutGrant(ctx, g), nvmegate.ECONFLICT, "")
	must(t, db.Close())
	db, err = Open(dir+"/s.db", Options{Now: func() time.Time { return t0 }})
	must(t, err)
	defer db.Close()
	if n := len(db.model.ended.m); n != 0 {
		t.Fatalf("%d ended jobs loaded", n)
	}
	check(db)
}

// An active job gains and loses nodes; a grant for a node that left is
// refused in its commit, even one decided before the node left.
func TestJobNodesChange(t *testing.T) {
	db := openTestDB(t)
	ctx := context.Background()
	inventory(t, db, "acme")
	must(t, db.CreateNamespace(ctx, newNamespace(subNQN(0), 1, "acme")))
	must(t, db.CreateJob(ctx, newJob("job-1", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 1, Mode: nvmegate.ModeReadOnly})))
	must(t, db.PutGrant(ctx, newGrant(1, subNQN(0))))
	wantMessage(t, wantError(t, db.PutGrant(ctx, newGrant(3, subNQN(0))), nvmegate.ECONFLICT, ""), "node spiffe://example.org/node/n0003 is no longer in job job-1")

	j, err := db.UpdateJobNodes(ctx, "job-1", nil, []string{nodeID(3), nodeID(2)}, []string{nodeID(1)})
	must(t, err)
	if want := []string{nodeID(2), nodeID(3)}; !reflect.DeepEqual(j.Nodes, want) {
		t.Fatalf("nodes %v, want %v", j.Nodes, want)
	}
	got, err := db.Job(ctx, "job-1")
	must(t, err)
	if !reflect.DeepEqual(got.Nodes, j.Nodes) {
		t.Fatalf("stored nodes %v, want %v", got.Nodes, j.Nodes)
	}
	must(t, db.PutGrant(ctx, newGrant(3, subNQN(0))))
	renewed := newGrant(1, subNQN(0))
	renewed.ExpiresAt = renewed.ExpiresAt.Add(time.Minute)
	wantMessage(t, wantError(t, db.PutGrant(ctx, renewed), nvmegate.ECONFLICT, ""), "n0001 is no longer in job job-1")

	rev := db.Revision()
	if _, err := db.UpdateJobNodes(ctx, "job-1", nil, []string{nodeID(2)}, []string{nodeID(9)}); err != nil || db.Revision() != rev {
		t.Fatalf("a change of nothing: %v, revision %d from %d", err, db.Revision(), rev)
	}
	one := uint32(1)
	_, err = db.UpdateJobNodes(ctx, "job-1", &one, []string{nodeID(4)}, nil)
	wantMessage(t, wantError(t, err, nvmegate.ECONFLICT, ""), "at generation 0, not 1")
	_, err = db.UpdateJobNodes(ctx, "job-1", nil, nil, []string{nodeID(2), nodeID(3)})
	wantMessage(t, wantError(t, err, nvmegate.ECONFLICT, ""), "finish it instead")
	_, err = db.UpdateJobNodes(ctx, "nope", nil, []string{nodeID(4)}, nil)
	wantError(t, err, nvmegate.ENOTFOUND, "")
	_, _, err = db.FinishJob(ctx, "job-1", nil)
	must(t, err)
	_, err = db.UpdateJobNodes(ctx, "job-1", nil, []string{nodeID(4)}, nil)
	wantMessage(t, wantError(t, err, nvmegate.ECONFLICT, ""), "is finished")
}
