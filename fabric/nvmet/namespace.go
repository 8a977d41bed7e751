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
// namespace of its own, and reports those a state asks it to export.
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
// removed and their mappings closed, first; the operator's namespaces are
// not touched. used collects the mappings in use.
//
// A namespace whose data key is being rotated is not exported: it is
// removed like one the state no longer has, its mapping closed, and its
// re-encryption started (or left running) once nothing holds the device.
//
// A namespace this target cannot serve — no dm-crypt, no re-encryption for
// a rotation, a device not wholly under its key, cryptsetup refusing to
// open it, the operator's namespace on its NSID — is not a failure of the
// state: it is left not exported (taken down if it was exported through a
// mapping of ours, never exported in the clear) and returned, and the
// other namespaces and the rest of the target are applied as the state
// says. So is a held namespace (fabric.Namespace.Held) not exported yet:
// without its data key it is kept as the target has it, never opened. The
// error is for what is not one namespace's (the namespaces directory
// cannot be read).
func (d *Driver) writeNamespaces(sub fabric.Subsystem, used map[string]bool) ([]fabric.NotServed, error) {
	dir := filepath.Join(d.Root, "subsystems", sub.NQN, "namespaces")
	var notServed []fabric.NotServed
	refuse := func(nsid uint32, format string, args ...any) {
		notServed = append(notServed, fabric.NotServed{Subsystem: sub.NQN, NSID: nsid, Reason: fmt.Sprintf(format, args...)})
	}
	stuck := func(nsid uint32, format string, args ...any) {
		notServed = append(notServed, fabric.NotServed{Subsystem: sub.NQN, NSID: nsid, Reason: fmt.Sprintf(format, args...), Exported: true})
	}
	export := map[string]fabric.Namespace{} // NSID → a namespace to export
	var rekey []cryptdev.Job
	for _, n := range sub.Namespaces {
		if n.BackingDevice == "" {
			continue
		}
		id := strconv.FormatUint(uint64(n.NSID), 10)
		switch {
		case d.Crypt == nil:
			refuse(n.NSID, "to be encrypted at rest and this target has no dm-crypt (cryptsetup); not exported")
		case n.Held():
			export[id] = n // kept as it is, below
		case n.NextDataKey != nil && d.Reencrypt == nil:
			refuse(n.NSID, "to be re-encrypted and this target agent cannot (no re-encryption directory); not exported")
		case n.NextDataKey != nil:
			rekey = append(rekey, cryptdev.Job{Name: mapping(sub.NQN, n.NSID), Device: n.BackingDevice, From: n.DataKey, To: n.NextDataKey,
				Subsystem: sub.NQN, NSID: n.NSID, Generation: n.NextGeneration})
		default:
			export[id] = n
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("nvmet: %w", err)
	}
	// Removals first: ours that the state does not export.
	for _, e := range ents {
		if _, ok := export[e.Name()]; ok {
			continue
		}
		if err := d.takeDown(filepath.Join(dir, e.Name()), used); err != nil {
			nsid, _ := strconv.ParseUint(e.Name(), 10, 32)
			stuck(uint32(nsid), "not to be exported, and not taken down: %v", err)
		}
	}
	for _, n := range sub.Namespaces {
		id := strconv.FormatUint(uint64(n.NSID), 10)
		if _, ok := export[id]; !ok {
			continue
		}
		ns := filepath.Join(dir, id)
		if n.Held() {
			if why := d.keep(ns, mapping(sub.NQN, n.NSID), used); why != "" {
				refuse(n.NSID, "%s", why)
			}
			continue
		}
		if err := d.writeNamespace(ns, mapping(sub.NQN, n.NSID), n, used); err != nil {
			// Never left half made: taken down if it is ours (the
			// operator's stays the operator's).
			if derr := d.takeDown(ns, used); derr != nil {
				stuck(n.NSID, "%v; and not taken down: %v", err, derr)
				continue
			}
			refuse(n.NSID, "%v", err)
		}
	}
	for _, j := range rekey {
		// Its namespace is gone above if it was exported; the mapping
		// may be open without one.
		if err := d.Crypt.Close(j.Name); err != nil {
			refuse(j.NSID, "re-encryption not started: %v", err)
			continue
		}
		d.Reencrypt.Start(j)
	}
	return notServed, nil
}

// writeNamespace exports n as namespace directory ns through mapping
// name, and marks the mapping used.
func (d *Driver) writeNamespace(ns, name string, n fabric.Namespace, used map[string]bool) (err error) {
	if d.Reencrypt != nil {
		if err := d.Reencrypt.Check(name, n.BackingDevice, n.DataKey); err != nil {
			return err
		}
	}
	path, err := d.Crypt.Open(name, n.BackingDevice, n.DataKey)
	if err != nil {
		return err
	}
	used[name] = true
	defer func() {
		if err != nil {
			// Not used: closeUnused closes it, unless a namespace of
			// ours still holds it (takeDown closes it then).
			delete(used, name)
		}
	}()
	if err := mkdir(ns); err != nil {
		return err
	}
	cur, _ := os.ReadFile(filepath.Join(ns, "device_path"))
	// A new namespace's device_path reads "(null)" (Linux 6.12).
	if dp := strings.TrimSpace(string(cur)); dp != path {
		if _, prev := ours(dp); !prev && dp != "" && dp != "(null)" {
			// Another device, not one of ours: the operator's namespace
			// under the same NSID. Refuse rather than take it over.
			return errors.New("it exists on another device; remove it or its backing_device")
		}
		if err := writeAttr(filepath.Join(ns, "enable"), "0", false); err != nil {
			return err
		}
		if err := writeAttr(filepath.Join(ns, "device_path"), path, false); err != nil {
			return err
		}
	}
	return writeAttr(filepath.Join(ns, "enable"), "1", false)
}

// keep keeps a held namespace as the target has it: exported through
// mapping name, whose key the target holds; or, if it is not, not
// exported (why says so). Nothing is opened or written.
func (d *Driver) keep(ns, name string, used map[string]bool) (why string) {
	const away = "no data key from the gateway (its key store is away)"
	dp, err := os.ReadFile(filepath.Join(ns, "device_path"))
	if err != nil {
		return away + "; not exported until it gives one"
	}
	if got, mine := ours(string(dp)); !mine || got != name {
		return away + "; not exported until it gives one (namespace " + filepath.Base(ns) + " is not ours)"
	}
	used[name] = true // its mapping stays open: the namespace uses it
	if en, _ := os.ReadFile(filepath.Join(ns, "enable")); strings.TrimSpace(string(en)) != "1" {
		return away + "; kept as it is, disabled"
	}
	return ""
}

// takeDown disables and removes namespace directory ns if it is ours, and
// closes its mapping; the operator's, or none, is left alone. A mapping
// that does not close is marked used (it is: held open), so that
// closeUnused does not report it again.
func (d *Driver) takeDown(ns string, used map[string]bool) error {
	dp, err := os.ReadFile(filepath.Join(ns, "device_path"))
	if err != nil {
		return nil // none
	}
	name, mine := ours(string(dp))
	if !mine {
		return nil // the operator's
	}
	if err := writeAttr(filepath.Join(ns, "enable"), "0", false); err != nil {
		return err
	}
	if err := rmdir(ns); err != nil {
		return err
	}
	if d.Crypt != nil {
		if err := d.Crypt.Close(name); err != nil {
			used[name] = true
			return fmt.Errorf("nvmet: %w", err)
		}
	}
	return nil
}

// closeUnused closes the mappings of ours no namespace of the state uses
// (their namespace or subsystem went while the agent was away). One that
// does not close holds its key in the kernel: reported as not taken down
// (its namespace is not known here, only the mapping's name).
func (d *Driver) closeUnused(used map[string]bool) ([]fabric.NotServed, error) {
	if d.Crypt == nil {
		return nil, nil
	}
	names, err := d.Crypt.List()
	if err != nil {
		return nil, fmt.Errorf("nvmet: %w", err)
	}
	var stuck []fabric.NotServed
	for _, n := range names {
		if !used[n] {
			if err := d.Crypt.Close(n); err != nil {
				stuck = append(stuck, fabric.NotServed{Reason: fmt.Sprintf("dm-crypt mapping %s of a namespace no longer in the state not closed: %v", n, err), Exported: true})
			}
		}
	}
	return stuck, nil
}
