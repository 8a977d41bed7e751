package nvmegate

import (
	"fmt"
	"strconv"
	"strings"
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
	Generation     uint32         // the run under this ID: 0, then +1 per requeue (Slurm's restart count)
	User           string         // the user the job runs as, as its scheduler names them (for the record)
}

// MaxJobNodes bounds a job's node set (and a hostlist's expansion).
const MaxJobNodes = 100_000

// ScopeDiff says how other's scope differs from j's (tenant, nodes,
// namespaces with modes, regions, expiry, user), in words; empty if it
// is the same scope. The order of nodes, namespaces and regions does not
// matter.
func (j *Job) ScopeDiff(other *Job) string {
	var diffs []string
	if j.Tenant != other.Tenant {
		diffs = append(diffs, "tenant "+show(other.Tenant)+" is not "+show(j.Tenant))
	}
	if d := setDiff("node", j.Nodes, other.Nodes); d != "" {
		diffs = append(diffs, d)
	}
	key := func(ns []JobNamespace) []string {
		out := make([]string, len(ns))
		for i, n := range ns {
			out[i] = n.SubsystemNQN + "/" + strconv.FormatUint(uint64(n.NSID), 10) + ":" + n.Mode
		}
		return out
	}
	if d := setDiff("namespace", key(j.Namespaces), key(other.Namespaces)); d != "" {
		diffs = append(diffs, d)
	}
	if d := setDiff("region", j.AllowedRegions, other.AllowedRegions); d != "" {
		diffs = append(diffs, d)
	}
	if !j.ExpiresAt.Equal(other.ExpiresAt) {
		diffs = append(diffs, "expiry "+other.ExpiresAt.UTC().Format(time.RFC3339)+" is not "+j.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if j.User != other.User {
		diffs = append(diffs, "user "+show(other.User)+" is not "+show(j.User))
	}
	return strings.Join(diffs, "; ")
}

// setDiff names what b adds to a and what it lacks of a, counting and
// showing the first of each.
func setDiff(what string, a, b []string) string {
	in := func(s []string) map[string]bool {
		m := make(map[string]bool, len(s))
		for _, v := range s {
			m[v] = true
		}
		return m
	}
	ina, inb := in(a), in(b)
	var added, missing []string
	for _, v := range b {
		if !ina[v] {
			added = append(added, v)
		}
	}
	for _, v := range a {
		if !inb[v] {
			missing = append(missing, v)
		}
	}
	var parts []string
	if len(added) > 0 {
		parts = append(parts, fmt.Sprintf("%d %s(s) added (%s first)", len(added), what, show(added[0])))
	}
	if len(missing) > 0 {
		parts = append(parts, fmt.Sprintf("%d %s(s) missing (%s first)", len(missing), what, show(missing[0])))
	}
	return strings.Join(parts, ", ")
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
	if len(j.Nodes) > MaxJobNodes {
		return Invalid("nodes", "at most %d nodes (got %d)", MaxJobNodes, len(j.Nodes))
	}
	if len(j.User) > 64 {
		return Invalid("user", "must be at most 64 bytes (got %d)", len(j.User))
	}
	if err := ValidateString("user", j.User); err != nil {
		return err
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
