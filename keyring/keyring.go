package keyring

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// PSKType is the kernel key type of NVMe TLS PSKs.
const PSKType = "psk"

// NVMeRing is the name of the kernel's NVMe keyring.
const NVMeRing = ".nvme"

// ErrNoRing reports that the keyring is not there: for ".nvme", no NVMe
// module with TLS support (nvme-tcp, nvmet-tcp on Linux 6.7 or later) is
// loaded.
var ErrNoRing = errors.New("keyring: no such keyring")

// Ring is one kernel keyring and the type of the keys this process keeps
// in it.
type Ring struct {
	id      int
	name    string
	keyType string
}

// ID is the keyring's serial number, as the fabrics options keyring= and
// the kernel's handshake upcall name it.
func (r *Ring) ID() int { return r.id }

// String names the ring.
func (r *Ring) String() string { return fmt.Sprintf("keyring %s (%d)", r.name, r.id) }

// findInProcKeys returns the serial of the keyring named name in a
// /proc/keys listing: "<hex serial> <flags> <usage> <timeout> <perm> <uid>
// <gid> keyring <name>: <summary>".
func findInProcKeys(r io.Reader, name string) (int, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || f[7] != "keyring" || f[8] != name+":" {
			continue
		}
		id, err := strconv.ParseUint(f[0], 16, 32)
		if err != nil {
			return 0, fmt.Errorf("keyring: /proc/keys: serial %q: %w", f[0], err)
		}
		return int(id), nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("keyring: /proc/keys: %w", err)
	}
	return 0, fmt.Errorf("%w: %s", ErrNoRing, name)
}

// procKeysRing finds a keyring by name in /proc/keys (the keys this
// process may view).
func procKeysRing(name string) (int, error) {
	f, err := os.Open("/proc/keys")
	if err != nil {
		return 0, fmt.Errorf("keyring: %w", err)
	}
	defer f.Close()
	return findInProcKeys(f, name)
}

// parseDescribe splits KEYCTL_DESCRIBE's "type;uid;gid;perm;description".
func parseDescribe(s string) (keyType, desc string, ok bool) {
	parts := strings.SplitN(s, ";", 5)
	if len(parts) != 5 {
		return "", "", false
	}
	return parts[0], parts[4], true
}
