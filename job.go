package nvmegate

import (
	"strconv"
	"time"
)

// Access modes of a namespace in a job scope.
const (
	ModeReadOnly  = "ro"
	ModeReadWrite = "rw"
)

// Job states.
const (
	JobActive   = "active"
	JobFinished = "finished"
	JobExpired  = "expired"
)

// Job is the scope a scheduler admitted for one training job: which nodes may
// reach which namespaces, how, where, and until when.
type Job struct {
	ID             string         // the scheduler's job ID
	Tenant         string         // the tenant the job runs for
	Scheduler      string         // SPIFFE ID of the scheduler that admitted it
	Nodes          []string       // SPIFFE IDs of the nodes that run it (spiffe://<td>/node/<host>)
	Namespaces     []JobNamespace // what the job may touch, with modes
	AllowedRegions []string       // regions the job's data may be read in
	ExpiresAt      time.Time      // end of the scope; grants never outlive it
	State          string         // JobActive, JobFinished or JobExpired
	AdmittedAt     time.Time      // set at admission
	FinishedAt     time.Time      // set at finish or expiry
	DecisionID     string         // the admitting policy decision
}

// JobNamespace is one namespace in a job scope.
type JobNamespace struct {
	SubsystemNQN string
	NSID         uint32
	Mode         string // ModeReadOnly or ModeReadWrite
}

// Validate checks the job request as a scheduler sends it; now is used to
// refuse an expiry in the past.
func (j *Job) Validate(now time.Time) error {
	if err := ValidateJobID("job_id", j.ID); err != nil {
		return err
	}
	if err := ValidateTenant("tenant", j.Tenant); err != nil {
		return err
	}
	if len(j.Nodes) == 0 {
		return Invalid("nodes", "at least one node is required")
	}
	seen := map[string]bool{}
	for i, n := range j.Nodes {
		f := "nodes[" + strconv.Itoa(i) + "]"
		if err := ValidateNodeID(f, n); err != nil {
			return err
		}
		if seen[n] {
			return Invalid(f, "node appears twice")
		}
		seen[n] = true
	}
	if len(j.Namespaces) == 0 {
		return Invalid("namespaces", "at least one namespace is required")
	}
	for i := range j.Namespaces {
		ns := &j.Namespaces[i]
		f := "namespaces[" + strconv.Itoa(i) + "]"
		if err := ValidateNQN(f+".subsystem_nqn", ns.SubsystemNQN); err != nil {
			return err
		}
		if err := ValidateNSID(f+".nsid", ns.NSID); err != nil {
			return err
		}
		if ns.Mode != ModeReadOnly && ns.Mode != ModeReadWrite {
			return Invalid(f+".mode", "must be ro or rw (got %s)", show(ns.Mode))
		}
	}
	if len(j.AllowedRegions) == 0 {
		return Invalid("allowed_regions", "at least one region is required")
	}
	for i, r := range j.AllowedRegions {
		if err := ValidateLabel("allowed_regions["+strconv.Itoa(i)+"]", r); err != nil {
			return err
		}
	}
	if j.ExpiresAt.IsZero() {
		return Invalid("expires_at", "is required")
	}
	if !j.ExpiresAt.After(now) {
		return Invalid("expires_at", "must be in the future")
	}
	return nil
}
