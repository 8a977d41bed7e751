package csidriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// HostMounter publishes with the kernel's bind mounts: the pod's target
// path is a file the block device is bind-mounted on.
type HostMounter struct{}

// Publish creates target and bind-mounts device on it.
func (HostMounter) Publish(device, target string, readonly bool) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount(device, target, "", unix.MS_BIND, ""); err != nil {
		os.Remove(target)
		return fmt.Errorf("bind-mount %s on %s: %w", device, target, err)
	}
	if readonly {
		// The kernel checks a mount's read-only flag for files, not for
		// device nodes: this keeps the pod's path read-only as it shows,
		// and the device itself is made read-only for a read-only job
		// (ReadOnly, at staging). A pod's readonly on a writer volume is
		// the pod's own promise.
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			unix.Unmount(target, 0)
			os.Remove(target)
			return fmt.Errorf("remount %s read-only: %w", target, err)
		}
	}
	return nil
}

// Unpublish unmounts target (every mount stacked on it) and removes it.
func (HostMounter) Unpublish(target string) error {
	for range 8 {
		err := unix.Unmount(target, 0)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not a mount point (any more)
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ReadOnly sets the block device read-only (BLKROSET): the kernel then
// refuses every write to it on this node, whichever path opens it.
func (HostMounter) ReadOnly(device string) error {
	f, err := os.Open(device)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.BLKROSET, 1)
}
