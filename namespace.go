package nvmegate

import (
	"path"
	"strconv"
	"strings"
	"time"
)

// Data classes of the default policy. Sites may define others in policy data;
// the inventory only checks the spelling.
const (
	ClassPublic     = "public"
	ClassInternal   = "internal"
	ClassRestricted = "restricted"
	ClassImmutable  = "immutable"
)

// MaxNSID is the largest valid namespace ID; 0xFFFFFFFF is the broadcast value.
const MaxNSID = 0xFFFFFFFE

// Namespace is one namespace of a subsystem, holding one dataset (or a
// checkpoint area) of one tenant.
type Namespace struct {
	SubsystemNQN string  // the subsystem it belongs to
	NSID         uint32  // 1-MaxNSID, unique within the subsystem
	Tenant       string  // owner; must equal the subsystem's tenant
	Region       string  // residency region of the data
	DataClass    string  // drives policy obligations (e.g. restricted, immutable)
	Dataset      Dataset // what the namespace holds
	QoS          QoS     // reservation/cap on the target; zero means none
	// BackingDevice is the block device on the target that holds the
	// namespace ("/dev/nvme0n1", "/dev/md/ds1"). When set, the target
	// agent exports it encrypted at rest: a dm-crypt mapping keyed with the
	// namespace's data key, which nvmet serves. "" leaves the namespace to
	// the storage operator (not encrypted by nvmegate).
	BackingDevice string
	CreatedAt     time.Time // set by the store
	// Incarnation names this record among every namespace ever added
	// under the same subsystem NQN and NSID: random, set by the store when
	// it creates the record ("" for records from before incarnations).
	// The namespace's data key is bound to it, so a namespace removed
	// without erase and added again never inherits the old data key.
	Incarnation string
}

// Dataset names the data in a namespace for lineage: auditors match these
// digests against their data catalog.
type Dataset struct {
	Name   string // e.g. "common-crawl/2026-10"
	Digest string // sha256:<hex> of the dataset manifest
}

// QoS caps a namespace on its target; zero fields mean unlimited.
type QoS struct {
	MaxIOPS uint64 // read+write I/O per second
	MaxMBps uint64 // read+write megabytes per second
}

// ValidateNSID checks a namespace ID: 1-MaxNSID (0 is invalid and
// 0xFFFFFFFF is the broadcast value).
func ValidateNSID(field string, nsid uint32) error {
	if nsid == 0 || nsid > MaxNSID {
		return Invalid(field, "must be 1-%d (got %d)", uint32(MaxNSID), nsid)
	}
	return nil
}

// Key identifies a namespace in the inventory.
func (n *Namespace) Key() NamespaceKey { return NamespaceKey{n.SubsystemNQN, n.NSID} }

// NamespaceKey identifies a namespace: subsystem NQN and NSID.
type NamespaceKey struct {
	SubsystemNQN string
	NSID         uint32
}

// KeyName names the namespace in the key store: "<subsystem NQN>/<NSID>".
func (k NamespaceKey) KeyName() string {
	return k.SubsystemNQN + "/" + strconv.FormatUint(uint64(k.NSID), 10)
}

// Validate checks the namespace on its own; the store checks the subsystem
// exists and has the same tenant.
func (n *Namespace) Validate() error {
	if err := ValidateNQN("subsystem_nqn", n.SubsystemNQN); err != nil {
		return err
	}
	if err := ValidateNSID("nsid", n.NSID); err != nil {
		return err
	}
	if err := ValidateTenant("tenant", n.Tenant); err != nil {
		return err
	}
	if err := ValidateLabel("region", n.Region); err != nil {
		return err
	}
	if err := ValidateLabel("data_class", n.DataClass); err != nil {
		return err
	}
	if err := ValidateDatasetName("dataset.name", n.Dataset.Name); err != nil {
		return err
	}
	if err := ValidateDigest("dataset.digest", n.Dataset.Digest); err != nil {
		return err
	}
	return ValidateDevicePath("backing_device", n.BackingDevice)
}

// ValidateDevicePath checks a block device path on a target: "" or an
// absolute, clean path under /dev/ of printable characters without spaces
// or commas (it becomes a configfs attribute and a device-mapper table).
func ValidateDevicePath(field, v string) error {
	if v == "" {
		return nil
	}
	if err := ValidateString(field, v); err != nil {
		return err
	}
	if len(v) > 255 || !strings.HasPrefix(v, "/dev/") || path.Clean(v) != v || strings.ContainsAny(v, " ,\t") {
		return Invalid(field, "must be a clean absolute path under /dev/ of at most 255 bytes, without spaces or commas (got %s)", show(v))
	}
	return nil
}
