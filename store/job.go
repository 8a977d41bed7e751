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
}

type jobNamespaceRecord struct {
	SubsystemNQN string `json:"subsystem_nqn"`
	NSID         uint32 `json:"nsid"`
	Mode         string `json:"mode"`
}

func encodeJob(j *nvmegate.Job) ([]byte, error) {
	r := jobRecord{V: recordVersion, ID: j.ID, Tenant: j.Tenant, Scheduler: j.Scheduler, Nodes: j.Nodes,
		AllowedRegions: j.AllowedRegions, ExpiresAt: j.ExpiresAt.UTC(), State: j.State, AdmittedAt: j.AdmittedAt.UTC(),
		FinishedAt: j.FinishedAt.UTC(), DecisionID: j.DecisionID}
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
		ExpiresAt: r.ExpiresAt, State: r.State, AdmittedAt: r.AdmittedAt, FinishedAt: r.FinishedAt, DecisionID: r.DecisionID}
	for _, n := range r.Namespaces {
		j.Namespaces = append(j.Namespaces, nvmegate.JobNamespace(n))
	}
	return j, nil
}

// CreateJob stores an admitted job as active and sets AdmittedAt. It fails
// with EEXISTS if the job ID is taken (job IDs are never reused, so that
// the audit log's job entries stay unambiguous), and with ECONFLICT if a
// namespace it names is not in the inventory or is not the job's tenant's.
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
	err = db.update(ctx, func(tx *txn) error {
		if tx.Bucket(bucketJobs).Get([]byte(j.ID)) != nil {
			return nvmegate.Errorf(nvmegate.EEXISTS, "job %q already exists", j.ID)
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
	j.State, j.AdmittedAt, j.FinishedAt, j.ExpiresAt = rec.State, rec.AdmittedAt, rec.FinishedAt, rec.ExpiresAt.UTC()
	return nil
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

// FinishJob marks an active job finished at now and returns it. A job that
// already finished or expired fails with ECONFLICT.
func (db *DB) FinishJob(ctx context.Context, id string) (*nvmegate.Job, error) {
	if db.forwards() {
		o := &finishJobOp{ID: id}
		if ok, err := db.remote(ctx, "finish_job", o); ok {
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
		if j.State != nvmegate.JobActive {
			return nvmegate.Errorf(nvmegate.ECONFLICT, "job %q is already %s", id, j.State)
		}
		j.State, j.FinishedAt = nvmegate.JobFinished, db.now().UTC()
		val, err := encodeJob(j)
		if err != nil {
			return err
		}
		stored, err := decodeJob(val) // j is the caller's
		if err != nil {
			return err
		}
		tx.record(op{job: clipJob(stored)})
		return put(tx, bucketJobs, []byte(id), val)
	})
	return j, err
}
