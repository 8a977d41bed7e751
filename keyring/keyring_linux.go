package keyring

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Permissions of the keys this package adds: everything for a possessor
// (tlshd possesses the ring it is handed, and through it the key), view
// and search for the owner, nothing for anyone else. The payload is
// readable only through possession.
const pskPerm = keyPosAll | keyUsrView | keyUsrSearch

// From <linux/key.h> (x/sys/unix does not carry them).
const (
	keyPosAll    = 0x3f000000
	keyUsrView   = 0x00010000
	keyUsrSearch = 0x00080000
)

// NVMe returns the kernel's ".nvme" keyring, where nvmet finds the PSKs of
// the hosts it lets in; ErrNoRing if no NVMe TLS module is loaded.
func NVMe() (*Ring, error) {
	id, err := procKeysRing(NVMeRing)
	if err != nil {
		return nil, err
	}
	// Possess the ring (link it into the process keyring): the kernel
	// grants the owner of a key only view on it, and this process must set
	// its keys' permissions and invalidate them, which needs possession
	// (found on Linux 6.12: EACCES from KEYCTL_SETPERM otherwise).
	if _, err := unix.KeyctlInt(unix.KEYCTL_LINK, id, unix.KEY_SPEC_PROCESS_KEYRING, 0, 0); err != nil {
		return nil, fmt.Errorf("keyring: possess %s: %w", NVMeRing, err)
	}
	return &Ring{id: id, name: NVMeRing, keyType: PSKType}, nil
}

// Named returns the keyring called name in the calling user's keyring,
// making it if it is not there. The user keyring outlives the process, so
// a restarted agent finds the ring — and the keys live controllers name —
// again.
func Named(name string) (*Ring, error) {
	if name == "" || name == NVMeRing {
		return nil, fmt.Errorf("keyring: %q is not a name for a keyring of our own", name)
	}
	if id, err := unix.KeyctlSearch(unix.KEY_SPEC_USER_KEYRING, "keyring", name, 0); err == nil {
		return &Ring{id: id, name: name, keyType: PSKType}, nil
	}
	id, err := unix.AddKey("keyring", name, nil, unix.KEY_SPEC_USER_KEYRING)
	if err != nil {
		return nil, fmt.Errorf("keyring: make %s: %w", name, err)
	}
	return &Ring{id: id, name: name, keyType: PSKType}, nil
}

// Set puts payload in the ring under desc, replacing the payload of a key
// already there under desc (it keeps its serial). It returns the key's
// serial.
func (r *Ring) Set(desc string, payload []byte) (int, error) {
	if desc == "" || len(payload) == 0 {
		return 0, fmt.Errorf("keyring: set: empty description or payload")
	}
	id, err := unix.AddKey(r.keyType, desc, payload, r.id)
	if err != nil {
		return 0, fmt.Errorf("keyring: add %s key %q to %s: %w", r.keyType, desc, r, err)
	}
	if err := unix.KeyctlSetperm(id, pskPerm); err != nil {
		_, _ = unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0)
		return 0, fmt.Errorf("keyring: set permissions of %q: %w", desc, err)
	}
	return id, nil
}

// Remove invalidates the key desc in the ring, if it is there: the kernel
// drops it from every ring at once, so no later handshake finds it.
func (r *Ring) Remove(desc string) error {
	id, err := r.Lookup(desc)
	if err != nil || id == 0 {
		return err
	}
	if _, err := unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0); err != nil && !errors.Is(err, unix.ENOKEY) {
		return fmt.Errorf("keyring: invalidate %q: %w", desc, err)
	}
	return nil
}

// Lookup returns the serial of the key desc linked in the ring itself
// (not in rings below it), or 0 if there is none.
func (r *Ring) Lookup(desc string) (int, error) {
	keys, err := r.List()
	if err != nil {
		return 0, err
	}
	return keys[desc], nil
}

// List returns the keys of the ring's key type linked in the ring itself,
// by description.
func (r *Ring) List() (map[string]int, error) {
	ids, err := r.serials()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(ids))
	for _, id := range ids {
		d, err := unix.KeyctlString(unix.KEYCTL_DESCRIBE, id)
		if err != nil {
			if errors.Is(err, unix.ENOKEY) || errors.Is(err, unix.EKEYREVOKED) || errors.Is(err, unix.EKEYEXPIRED) {
				continue // invalidated or gone between the read and now
			}
			return nil, fmt.Errorf("keyring: describe key %d: %w", id, err)
		}
		if typ, desc, ok := parseDescribe(d); ok && typ == r.keyType {
			out[desc] = id
		}
	}
	return out, nil
}

// serials reads the serials linked in the ring (KEYCTL_READ on a keyring:
// an array of 32-bit serials).
func (r *Ring) serials() ([]int, error) {
	buf := make([]byte, 4096)
	for {
		n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, r.id, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("keyring: read %s: %w", r, err)
		}
		if n <= len(buf) {
			ids := make([]int, 0, n/4)
			for i := 0; i+4 <= n; i += 4 {
				ids = append(ids, int(int32(binary.NativeEndian.Uint32(buf[i:]))))
			}
			return ids, nil
		}
		buf = make([]byte, n)
	}
}
