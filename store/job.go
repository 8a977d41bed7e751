package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate"
)

// JobFilter narrows ListJobs; empty fields match everything.
type JobFilter struct {
	Tenant string
	State  string
}

type jobRecord struct {
	V              int                  `json:"v"`
	ID             string               `json:"id"`
	Tenant         string               `json:"tenant"`
	Scheduler      string               `json:"scheduler"`
	Nodes          []string             `json:"nodes"`
	Namespaces     []jobNamespaceRecord `json:"namespaces"`
	AllowedRegions []string             `json:"allowed_regions"`
	ExpiresAt      time.Time            `json:"expires_at"`
	State          string               `json:"state"`
	AdmittedAt     time.Time            `json:"admitted_at"`
	FinishedAt     time.Time            `json:"finished_at,omitzero"`
	DecisionID     string               `json:"decision_id"`
	Generation     uint32               `json:"generation,omitempty"`
	User           string               `json:"user,omitempty"`
}

type jobNamespaceRecord struct {
	SubsystemNQN string `json:"subsystem_nqn"`
	NSID         uint32 `json:"nsid"`
	Mode         string `json:"mode"`
}

func encodeJob(j *nvmegate.Job) ([]byte, error) {
	r := jobRecord{V: recordVersion, ID: j.ID, Tenant: j.Tenant, Scheduler: j.Scheduler, Nodes: j.Nodes,
		AllowedRegions: j.AllowedRegions, ExpiresAt: j.ExpiresAt.UTC(), State: j.State, AdmittedAt: j.AdmittedAt.UTC(),
		FinishedAt: j.FinishedAt.UTC(), DecisionID: j.DecisionID, Generation: j.Generation, User: j.User}
	if j.FinishedAt.IsZero() {
		r.FinishedAt = time.Time{}
	}
	for _, n := range j.Namespaces {
		r.Namespaces = append(r.Namespaces, jobNamespaceRecord(n))
	}
	return json.Marshal(r)
}

func decodeJob(v []byte) (*nvmegate.Job, error) {
	var r jobRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("store: job record: %w", err)
	}
	if r.V != recordVersion {
		return nil, fmt.Errorf("store: job record version %d", r.V)
	}
	j := &nvmegate.Job{ID: r.ID, Tenant: r.Tenant, Scheduler: r.Scheduler, Nodes: r.Nodes, AllowedRegions: r.AllowedRegions,
		ExpiresAt: r.ExpiresAt, State: r.State, AdmittedAt: r.AdmittedAt, FinishedAt: r.FinishedAt, DecisionID: r.DecisionID,
		Generation: r.Generation, User: r.User}
	for _, n := range r.Namespaces {
		j.Namespaces = append(j.Namespaces, nvmegate.JobNamespace(n))
	}
	return j, nil
}

// CreateJob stores an admitted job as active and sets AdmittedAt, or
// answers the job as stored if the same admission was stored before, so
// that a scheduler may retry it. The job ID's stored generation decides:
//
//   - none: j is stored;
//   - another tenant's job: EEXISTS (an ID is never taken over);
//   - j's generation, active, the same scope (Job.ScopeDiff): nothing is
//     written, and j takes the stored job's fields;
//   - j's generation with another scope, or ended: EEXISTS, saying which;
//   - an earlier generation that has ended: j takes its place (a requeued
//     job; the log keeps every generation's records);
//   - an earlier generation still active: ECONFLICT (finish it first: its
//     grants must end before the next run's start);
//   - a later generation: ECONFLICT (a late call of an earlier run).
//
// It fails with ECONFLICT too if a namespace j names is not in the
// inventory or is not the job's tenant's.
func (db *DB) CreateJob(ctx context.Context, j *nvmegate.Job) error {
	if j == nil {
		return nvmegate.Invalid("", "a job is required")
	}
	if ok, err := db.remote(ctx, "create_job", &createOp[nvmegate.Job]{Record: j}); ok {
		return err
	}
	now := db.now().UTC()
	if err := j.Validate(now); err != nil {
		return err
	}
	rec := *j
	rec.State, rec.AdmittedAt, rec.FinishedAt = nvmegate.JobActive, now, time.Time{}
	val, err := encodeJob(&rec)
	if err != nil {
		return err
	}
	stored, err := decodeJob(val)
	if err != nil {
		return err
	}
	var same *nvmegate.Job
	err = db.update(ctx, func(tx *txn) error {
		if v := tx.Bucket(bucketJobs).Get([]byte(j.ID)); v != nil {
			old, err := decodeJob(v)
			if err != nil {
				return err
			}
			if same, err = db.admitOver(old, j); same != nil || err != nil {
				return err
			}
		}
		for _, jn := range j.Namespaces {
			n, err := getNamespace(tx.Tx, jn.SubsystemNQN, jn.NSID)
			if nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
				return nvmegate.Errorf(nvmegate.ECONFLICT, "namespace %s/%d is not in the inventory", jn.SubsystemNQN, jn.NSID)
			}
			if err != nil {
				return err
			}
			if n.Tenant != j.Tenant {
				return nvmegate.Errorf(nvmegate.ECONFLICT, "namespace %s/%d is not tenant %s's", jn.SubsystemNQN, jn.NSID, j.Tenant)
			}
		}
		tx.record(op{job: clipJob(stored)})
		return put(tx, bucketJobs, []byte(j.ID), val)
	})
	if err != nil {
		return err
	}
	if same != nil {
		*j = *same
		return nil
	}
	j.State, j.AdmittedAt, j.FinishedAt, j.ExpiresAt = rec.State, rec.AdmittedAt, rec.FinishedAt, rec.ExpiresAt.UTC()
	return nil
}

// admitOver decides an admission of j over old, the job stored under its
// ID (CreateJob): old itself if j is the same admission again, nil if j
// takes its place, or the refusal.
func (db *DB) admitOver(old, j *nvmegate.Job) (*nvmegate.Job, error) {
	db.expire(old)
	switch {
	case old.Tenant != j.Tenant:
		// Another tenant's job, whatever its generation or state: its ID
		// is never taken over (nor is the tenant named).
		return nil, nvmegate.Errorf(nvmegate.EEXISTS, "job ID %q is taken: choose another", j.ID)
	case old.Generation > j.Generation:
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "job %q is at generation %d: generation %d is over", j.ID, old.Generation, j.Generation)
	case old.Generation < j.Generation && old.State == nvmegate.JobActive:
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "job %q generation %d is still active: it is finished before generation %d is admitted", j.ID, old.Generation, j.Generation)
	case old.Generation < j.Generation:
		return nil, nil
	case old.State != nvmegate.JobActive:
		return nil, nvmegate.Errorf(nvmegate.EEXISTS, "job %q generation %d is %s; a requeued run is admitted as generation %d", j.ID, old.Generation, old.State, old.Generation+1)
	}
	if d := old.ScopeDiff(j); d != "" {
		return nil, nvmegate.Errorf(nvmegate.EEXISTS, "job %q generation %d is already admitted with another scope: %s", j.ID, old.Generation, d)
	}
	return old, nil
}

// Job returns a job, or ENOTFOUND. A job past its expiry is reported as
// expired whatever its stored state.
//
// Jobs are read on every node call, and a 10,000-node job is ~600 KB of
// JSON: the job is served from the model without copying its slices
// (Nodes, Namespaces, AllowedRegions), which are shared with every caller.
// Callers must not modify their elements; appending is safe (the slices
// are clipped), and so is changing the job's other fields.
func (db *DB) Job(ctx context.Context, id string) (*nvmegate.Job, error) {
	j, ok, err := db.model.job(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		// Ended (the model keeps active jobs), or none.
		if err := db.view(ctx, func(tx *bolt.Tx) error {
			j, err = getJob(tx, id)
			return err
		}); err != nil {
			return nil, err
		}
		if j.State != nvmegate.JobActive { // final: kept for the next reader
			c := *clipJob(j)
			db.model.ended.put(&c)
		}
	}
	db.expire(j)
	return j, nil
}

func getJob(tx *bolt.Tx, id string) (*nvmegate.Job, error) {
	v := tx.Bucket(bucketJobs).Get([]byte(id))
	if v == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "job %q not found", id)
	}
	return decodeJob(v)
}

// expire shows an active job past its expiry as expired.
func (db *DB) expire(j *nvmegate.Job) {
	if j.State == nvmegate.JobActive && !db.now().Before(j.ExpiresAt) {
		j.State = nvmegate.JobExpired
		if j.FinishedAt.IsZero() {
			j.FinishedAt = j.ExpiresAt
		}
	}
}

// ListJobs returns one page of jobs in ID order.
func (db *DB) ListJobs(ctx context.Context, f JobFilter, page Page) ([]*nvmegate.Job, string, error) {
	size, after, err := page.parse(kindJobs)
	if err != nil {
		return nil, "", err
	}
	var (
		items []*nvmegate.Job
		next  []byte
	)
	err = db.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		items, next, err = scanPage(c, nil, after, size, func(_, v []byte) (*nvmegate.Job, bool, []byte, error) {
			j, err := decodeJob(v)
			if err != nil {
				return nil, false, nil, err
			}
			db.expire(j)
			return j, (f.Tenant == "" || j.Tenant == f.Tenant) && (f.State == "" || j.State == f.State), nil, nil
		})
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return items, encodeToken(kindJobs, next), nil
}

// FinishJob marks an active job finished at now and returns it. With gen
// set, it finishes the job only at that generation or an earlier one (a
// requeued run's epilog may name the next generation already); a job at a
// later one is a late call of an earlier run. A job that ended already, or
// is at a later generation, is returned as it is, with unchanged true:
// finishing is safe to retry.
func (db *DB) FinishJob(ctx context.Context, id string, gen *uint32) (j *nvmegate.Job, unchanged bool, err error) {
	if db.forwards() {
		o := &finishJobOp{ID: id, Generation: gen}
		if ok, err := db.remote(ctx, "finish_job", o); ok {
			return o.Job, o.Unchanged, err
		}
	}
	err = db.update(ctx, func(tx *txn) error {
		var err error
		if j, err = getJob(tx.Tx, id); err != nil {
			return err
		}
		db.expire(j)
		if j.State != nvmegate.JobActive || (gen != nil && j.Generation > *gen) {
			unchanged = true
			return nil
		}
		j.State, j.FinishedAt = nvmegate.JobFinished, db.now().UTC()
		return putJob(tx, j)
	})
	return j, unchanged, err
}

// UpdateJobNodes adds nodes to active job id and removes others (an
// elastic job), and returns the job as stored. Adding a node the job has,
// or removing one it has not, is no change; a call that changes nothing
// writes nothing. With gen set, the job must be at that generation. It
// fails with ECONFLICT for a job that is not active, at another
// generation, or that would be left without nodes (finish it instead).
// The removed nodes' grants are the caller's to end; a grant decided
// before the removal is refused in its commit (OpenGrant).
func (db *DB) UpdateJobNodes(ctx context.Context, id string, gen *uint32, add, remove []string) (*nvmegate.Job, error) {
	if db.forwards() {
		o := &updateJobNodesOp{ID: id, Generation: gen, Add: add, Remove: remove}
		if ok, err := db.remote(ctx, "update_job_nodes", o); ok {
			return o.Job, err
		}
	}
	var j *nvmegate.Job
	err := db.update(ctx, func(tx *txn) error {
		var err error
		if j, err = getJob(tx.Tx, id); err != nil {
			return err
		}
		db.expire(j)
		switch {
		case j.State != nvmegate.JobActive:
			return nvmegate.Errorf(nvmegate.ECONFLICT, "job %q is %s: its nodes no longer change", id, j.State)
		case gen != nil && j.Generation != *gen:
			return nvmegate.Errorf(nvmegate.ECONFLICT, "job %q is at generation %d, not %d", id, j.Generation, *gen)
		}
		nodes, changed := mergeNodes(j.Nodes, add, remove)
		if !changed {
			return nil
		}
		if len(nodes) == 0 {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "removing every node of job %q would leave it none: finish it instead", id)
		}
		j.Nodes = nodes
		if err := j.Validate(time.Time{}); err != nil {
			return err
		}
		return putJob(tx, j)
	})
	return j, err
}

// mergeNodes is nodes without remove, then add's new ones in their order.
func mergeNodes(nodes, add, remove []string) ([]string, bool) {
	gone := make(map[string]bool, len(remove))
	for _, n := range remove {
		gone[n] = true
	}
	out := make([]string, 0, len(nodes)+len(add))
	have := make(map[string]bool, len(nodes)+len(add))
	changed := false
	for _, n := range nodes {
		if gone[n] {
			changed = true
			continue
		}
		out = append(out, n)
		have[n] = true
	}
	for _, n := range add {
		if !have[n] && !gone[n] {
			out = append(out, n)
			have[n] = true
			changed = true
		}
	}
	return out, changed
}

// putJob writes job j (the caller's: the model gets its own decoded copy).
func putJob(tx *txn, j *nvmegate.Job) error {
	val, err := encodeJob(j)
	if err != nil {
		return err
	}
	stored, err := decodeJob(val)
	if err != nil {
		return err
	}
	tx.record(op{job: clipJob(stored)})
	return put(tx, bucketJobs, []byte(j.ID), val)
}
