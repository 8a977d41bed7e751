package keyring

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// NVMe returns the kernel's ".nvme" keyring, where nvmet finds the PSKs of
// the hosts it lets in; ErrNoRing if no NVMe TLS module is loaded.
func NVMe() (*Ring, error) {
	id, err := procKeysRing(NVMeRing)
	if err != nil {
		return nil, err
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
	// tlshd, handed the ring by the kernel with a handshake, links it to
	// its session to read the PSK: the owner (root, as tlshd runs) may
	// view, read, search and link it, not only a possessor. Best effort:
	// a process that does not possess the ring (a service whose session
	// keyring does not reach the user keyring) cannot change it, and then
	// the ring keeps the kernel's defaults.
	_ = unix.KeyctlSetperm(id, ringPerm)
	return &Ring{id: id, name: name, keyType: PSKType}, nil
}

// ringPerm: everything for a possessor; view, read, write, search and
// link for the owner (KEY_POS_ALL | KEY_USR_VIEW|READ|WRITE|SEARCH|LINK).
const ringPerm = 0x3f1f0000

// Set puts payload in the ring under desc, replacing the payload of a key
// already there under desc (it keeps its serial). It returns the key's
// serial.
func (r *Ring) Set(desc string, payload []byte) (int, error) {
	if desc == "" || len(payload) == 0 {
		return 0, fmt.Errorf("keyring: set: empty description or payload")
	}
	// The kernel's default permissions: everything for a possessor (tlshd
	// possesses the ring it is handed, and the key through it), view for
	// the owner. They are not changed: that needs possession, which a Go
	// process cannot give all its threads (the process keyring reaches only
	// threads made after it; found on Linux 6.12).
	id, err := unix.AddKey(r.keyType, desc, payload, r.id)
	if err != nil {
		return 0, fmt.Errorf("keyring: add %s key %q to %s: %w", r.keyType, desc, r, err)
	}
	return id, nil
}

// Remove unlinks the key desc from the ring, if it is there: no later
// search of the ring (a handshake's) finds it, and the kernel frees it once
// nothing holds it. Unlinking needs write on the ring only, not possession
// of the key (which invalidating it would).
func (r *Ring) Remove(desc string) error {
	id, err := r.Lookup(desc)
	if err != nil || id == 0 {
		return err
	}
	if _, err := unix.KeyctlInt(unix.KEYCTL_UNLINK, id, r.id, 0, 0); err != nil && !errors.Is(err, unix.ENOKEY) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("keyring: unlink %q from %s: %w", desc, r, err)
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
