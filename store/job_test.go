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

	wantError(t, db.CreateJob(ctx, newJob("job-1", "acme", ro)), nvmegate.EEXISTS, "")
	e := wantError(t, db.CreateJob(ctx, newJob("job-2", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(0), NSID: 9, Mode: "ro"})), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "not in the inventory")
	e = wantError(t, db.CreateJob(ctx, newJob("job-3", "acme", nvmegate.JobNamespace{SubsystemNQN: subNQN(1), NSID: 1, Mode: "ro"})), nvmegate.ECONFLICT, "")
	wantMessage(t, e, "not tenant acme's")
	wantError(t, db.CreateJob(ctx, newJob("", "acme", ro)), nvmegate.EINVALID, "job_id")

	fin, err := db.FinishJob(ctx, "job-1")
	must(t, err)
	if fin.State != nvmegate.JobFinished || fin.FinishedAt.IsZero() {
		t.Fatalf("finished: %+v", fin)
	}
	if _, err := db.FinishJob(ctx, "job-1"); err == nil {
		t.Fatal("finished twice")
	} else {
		wantMessage(t, err, "already finished")
	}
	_, err = db.FinishJob(ctx, "nope")
	wantError(t, err, nvmegate.ENOTFOUND, "")
}

// A job past its expiry reads as expired and cannot be finished.
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
	if _, err := db.FinishJob(ctx, "job-1"); err == nil {
		t.Fatal("an expired job was finished")
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
	_, err := db.FinishJob(ctx, "job-001")
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
	if _, err := db.FinishJob(ctx, "job-1"); err != nil {
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
			_, err := db.FinishJob(ctx, id)
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
