package nvmet

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/cryptdev"
	"github.com/nvmegate/nvmegate/fabric"
)

// Crypt opens the dm-crypt mappings that namespaces with a backing device
// are exported through (cryptdev.Cryptsetup). nil: this driver exports no
// namespace of its own, and refuses a state that asks it to.
type Crypt interface {
	// Open maps device as name with the namespace's data key and returns
	// the mapped device's path (an open mapping on device is kept).
	Open(name, device string, dataKey []byte) (string, error)
	// Close removes mapping name, if open.
	Close(name string) error
	// List names the open mappings of ours.
	List() ([]string, error)
}

// Reencrypter re-encrypts namespaces offline for data-key rotations
// (cryptdev.Runner). nil: this driver refuses a rotation.
type Reencrypter interface {
	// Check refuses a device that is not wholly under dataKey (a
	// re-encryption under way or unfinished).
	Check(name, device string, dataKey []byte) error
	// Start re-encrypts in the background, once per mapping at a time,
	// and reports the end.
	Start(j cryptdev.Job)
}

// mapping is the dm-crypt mapping name of namespace nsid of sub.
func mapping(sub string, nsid uint32) string {
	return cryptdev.Name(nvmegate.NamespaceKey{SubsystemNQN: sub, NSID: nsid}.KeyName())
}

// ours reports whether a namespace's device_path is a mapping of ours,
// and its name: such a namespace is the driver's to change and remove;
// any other is the operator's.
func ours(devicePath string) (string, bool) {
	name := filepath.Base(strings.TrimSpace(devicePath))
	return name, strings.HasPrefix(name, cryptdev.Prefix) && strings.Contains(devicePath, "/mapper/")
}

// writeNamespaces exports sub's namespaces that have a backing device:
// each through a dm-crypt mapping keyed with its data key, as nvmet
// namespace NSID with the mapped device (a namespace is disabled to change
// its device). Namespaces of ours the state no longer has are disabled,
// removed and their mappings closed; the operator's namespaces are not
// touched. used collects the mappings in use.
//
// A namespace whose data key is being rotated is not exported: it is
// removed like one the state no longer has, its mapping closed, and its
// re-encryption started (or left running) once nothing holds the device.
func (d *Driver) writeNamespaces(sub fabric.Subsystem, used map[string]bool) error {
	dir := filepath.Join(d.Root, "subsystems", sub.NQN, "namespaces")
	keep := map[string]bool{}
	var rekey []cryptdev.Job
	for _, n := range sub.Namespaces {
		if n.BackingDevice == "" {
			continue
		}
		if d.Crypt == nil {
			return fmt.Errorf("nvmet: namespace %d of %s is to be encrypted at rest and this target has no dm-crypt (cryptsetup)", n.NSID, sub.NQN)
		}
		name := mapping(sub.NQN, n.NSID)
		if n.NextDataKey != nil {
			if d.Reencrypt == nil {
				return fmt.Errorf("nvmet: namespace %d of %s is to be re-encrypted and this target agent cannot (no re-encryption directory)", n.NSID, sub.NQN)
			}
			rekey = append(rekey, cryptdev.Job{Name: name, Device: n.BackingDevice, From: n.DataKey, To: n.NextDataKey,
				Subsystem: sub.NQN, NSID: n.NSID, Generation: n.NextGeneration})
			continue
		}
		if d.Reencrypt != nil {
			if err := d.Reencrypt.Check(name, n.BackingDevice, n.DataKey); err != nil {
				return fmt.Errorf("nvmet: namespace %d of %s: %w", n.NSID, sub.NQN, err)
			}
		}
		path, err := d.Crypt.Open(name, n.BackingDevice, n.DataKey)
		if err != nil {
			return fmt.Errorf("nvmet: namespace %d of %s: %w", n.NSID, sub.NQN, err)
		}
		used[name] = true
		id := strconv.FormatUint(uint64(n.NSID), 10)
		keep[id] = true
		ns := filepath.Join(dir, id)
		if err := mkdir(ns); err != nil {
			return err
		}
		cur, _ := os.ReadFile(filepath.Join(ns, "device_path"))
		// A new namespace's device_path reads "(null)" (Linux 6.12).
		if dp := strings.TrimSpace(string(cur)); dp != path {
			if _, prev := ours(dp); !prev && dp != "" && dp != "(null)" {
				// Another device, not one of ours: the operator's namespace
				// under the same NSID. Refuse rather than take it over.
				return fmt.Errorf("nvmet: namespace %d of %s exists on another device; remove it or its backing_device", n.NSID, sub.NQN)
			}
			if err := writeAttr(filepath.Join(ns, "enable"), "0", false); err != nil {
				return err
			}
			if err := writeAttr(filepath.Join(ns, "device_path"), path, false); err != nil {
				return err
			}
		}
		if err := writeAttr(filepath.Join(ns, "enable"), "1", false); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, e := range ents {
		if keep[e.Name()] {
			continue
		}
		ns := filepath.Join(dir, e.Name())
		dp, _ := os.ReadFile(filepath.Join(ns, "device_path"))
		name, mine := ours(string(dp))
		if !mine {
			continue // the operator's
		}
		if err := writeAttr(filepath.Join(ns, "enable"), "0", false); err != nil {
			return err
		}
		if err := rmdir(ns); err != nil {
			return err
		}
		if d.Crypt != nil {
			if err := d.Crypt.Close(name); err != nil {
				return fmt.Errorf("nvmet: %w", err)
			}
		}
	}
	for _, j := range rekey {
		// Its namespace is gone above if it was exported; the mapping
		// may be open without one.
		if err := d.Crypt.Close(j.Name); err != nil {
			return fmt.Errorf("nvmet: %w", err)
		}
		d.Reencrypt.Start(j)
	}
	return nil
}

// closeUnused closes the mappings of ours no namespace of the state uses
// (their namespace or subsystem went while the agent was away).
func (d *Driver) closeUnused(used map[string]bool) error {
	if d.Crypt == nil {
		return nil
	}
	names, err := d.Crypt.List()
	if err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	for _, n := range names {
		if !used[n] {
			if err := d.Crypt.Close(n); err != nil {
				return fmt.Errorf("nvmet: %w", err)
			}
		}
	}
	return nil
}
