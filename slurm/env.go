package slurm

import (
	"fmt"
	"strconv"

	"github.com/nvmegate/nvmegate"
)

// Job is what a job hook's environment says of its job (PrologSlurmctld,
// EpilogSlurmctld, and the node's Prolog and Epilog see the same).
type Job struct {
	ID       string // SLURM_JOB_ID
	Nodes    string // SLURM_JOB_NODELIST: a hostlist expression
	User     string // SLURM_JOB_USER
	UID      int    // SLURM_JOB_UID; -1 if not set
	Comment  string // SLURM_JOB_COMMENT (--comment)
	Restarts uint32 // SLURM_JOB_RESTART_COUNT: nvmegate's generation
}

// JobFromEnv reads the job from a hook's environment (getenv: os.Getenv).
func JobFromEnv(getenv func(string) string) (Job, error) {
	j := Job{ID: getenv("SLURM_JOB_ID"), Nodes: getenv("SLURM_JOB_NODELIST"), User: getenv("SLURM_JOB_USER"),
		Comment: getenv("SLURM_JOB_COMMENT"), UID: -1}
	if j.ID == "" {
		return Job{}, fmt.Errorf("SLURM_JOB_ID is not set: run this as a Slurm job hook")
	}
	// The ID names files under the hooks' run directory too.
	if err := nvmegate.ValidateJobID("SLURM_JOB_ID", j.ID); err != nil {
		return Job{}, err
	}
	if v := getenv("SLURM_JOB_UID"); v != "" {
		uid, err := strconv.ParseUint(v, 10, 31)
		if err != nil {
			return Job{}, fmt.Errorf("SLURM_JOB_UID=%q: %w", v, err)
		}
		j.UID = int(uid)
	}
	if v := getenv("SLURM_JOB_RESTART_COUNT"); v != "" {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return Job{}, fmt.Errorf("SLURM_JOB_RESTART_COUNT=%q: %w", v, err)
		}
		j.Restarts = uint32(n)
	}
	return j, nil
}
