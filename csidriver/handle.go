package csidriver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nvmegate/nvmegate"
)

// DriverName is the driver's name in CSI and in Kubernetes (CSIDriver,
// StorageClass provisioner, PV spec.csi.driver).
const DriverName = "csi.nvmegate.io"

// Volume is what a volume handle names: one namespace, for one job.
type Volume struct {
	NQN  string // the subsystem's NQN
	NSID uint32
	Job  string // the training job the volume is attached for
}

// Handle is the volume's CSI volume ID, "<nqn>/<nsid>@<job>". Kubernetes
// keys attachments by the handle, so each job's volume of one dataset has
// its own.
func (v Volume) Handle() string {
	return v.NQN + "/" + strconv.FormatUint(uint64(v.NSID), 10) + "@" + v.Job
}

// ParseHandle reads a volume handle. A job ID has no '@' and an NSID no
// '/', so the handle is cut from the right: an NQN may hold either.
func ParseHandle(h string) (Volume, error) {
	if len(h) > MaxHandle {
		return Volume{}, fmt.Errorf("volume ID %s is %d bytes; CSI allows %d", quote(h), len(h), MaxHandle)
	}
	rest, job, ok := cut(h, "@")
	if !ok {
		return Volume{}, fmt.Errorf("volume ID %s is not <subsystem NQN>/<nsid>@<job>", quote(h))
	}
	nqn, nsid, ok := cut(rest, "/")
	if !ok {
		return Volume{}, fmt.Errorf("volume ID %s has no /<nsid>", quote(h))
	}
	n, err := strconv.ParseUint(nsid, 10, 32)
	if err != nil {
		return Volume{}, fmt.Errorf("volume ID %s: namespace ID %s is not a number", quote(h), quote(nsid))
	}
	v := Volume{NQN: nqn, NSID: uint32(n), Job: job}
	if err := v.validate(); err != nil {
		return Volume{}, fmt.Errorf("volume ID %s: %w", quote(h), err)
	}
	// One volume, one handle: "…/01@j" would be a second attachment of
	// "…/1@j", and unpublishing it would take the node out of the job
	// under the other's pod.
	if v.Handle() != h {
		return Volume{}, fmt.Errorf("volume ID %s is not in its canonical form %s", quote(h), quote(v.Handle()))
	}
	return v, nil
}

// MaxHandle is CSI's size limit of a string field, which volume IDs keep:
// an NQN may be 223 bytes, so a long NQN leaves a short job.
const MaxHandle = 128

func (v Volume) validate() error {
	if err := nvmegate.ValidateNQN("subsystem NQN", v.NQN); err != nil {
		return err
	}
	if err := nvmegate.ValidateNSID("nsid", v.NSID); err != nil {
		return err
	}
	return nvmegate.ValidateJobID("job", v.Job)
}

// cut splits s around the last sep.
func cut(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// quote quotes caller input for an error, short and printable.
func quote(s string) string {
	if len(s) > 100 {
		return strconv.Quote(s[:100]) + "..."
	}
	return strconv.Quote(s)
}
