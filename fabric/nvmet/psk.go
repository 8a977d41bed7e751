package nvmet

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// PSKs is where the driver keeps the TLS PSKs of the hosts it lets in on
// TLS ports: the kernel's ".nvme" keyring (keyring.NVMe), which nvmet hands
// to tlshd with every handshake it accepts. nvmet itself has no per-host
// PSK attribute: a host's PSK is a key in that ring, described by the PSK
// identity the host presents.
type PSKs interface {
	Set(desc string, payload []byte) (int, error)
	Remove(desc string) error
	List() (map[string]int, error)
}

// pskKeys derives the keyring entries of host h on subsystem sub: for the
// configured PSK h.TLSPSK, the identity Linux hosts look up by default
// (v0, "NVMe0R<hh> <hostnqn> <subnqn>") and the TP 8018 identity with the
// PSK digest (v1, what the gateway hands out with --tls-key-identity),
// each with its TLS PSK, and the v1 identity older nvme-cli derives. The
// caller clears the payloads.
func pskKeys(h fabric.Host, sub string) (map[string][]byte, error) {
	k, err := nvmefmt.ParseTLSPSK(h.TLSPSK)
	if err != nil {
		return nil, fmt.Errorf("nvmet: host %s on %s: TLS PSK: %w", h.NQN, sub, err)
	}
	defer clear(k.PSK)
	c, err := nvmefmt.DeriveTLS(k, h.NQN, sub)
	if err != nil {
		return nil, fmt.Errorf("nvmet: host %s on %s: TLS PSK identities: %w", h.NQN, sub, err)
	}
	// nvme-cli up to 2.15 (libnvme up to 1.15: Debian 13's nvme-cli 2.13
	// among them) derives with non-RFC labels and inserts the result under
	// a v1 identity of its own digest: a third key, under its own name, so
	// that hosts connecting with the `nvme connect --tls-key` the gateway
	// prints get in too.
	compat, err := nvmefmt.DeriveTLS(k, h.NQN, sub, nvmefmt.CompatLabels())
	if err != nil {
		clear(c.PSKV0)
		clear(c.PSKV1)
		return nil, fmt.Errorf("nvmet: host %s on %s: TLS PSK identities: %w", h.NQN, sub, err)
	}
	clear(compat.PSKV0)
	return map[string][]byte{c.IdentityV0: c.PSKV0, c.IdentityV1: c.PSKV1, compat.IdentityV1: compat.PSKV1}, nil
}

// pskSubsystem returns the subsystem NQN of a PSK identity
// ("NVMe<v><R|G><hh> <hostnqn> <subnqn>[ <digest>]"), or "" if desc is not
// one: the driver removes only keys of the subsystems it owns.
func pskSubsystem(desc string) string {
	f := strings.Fields(desc)
	if len(f) < 3 || len(f[0]) != 8 || !strings.HasPrefix(f[0], "NVMe") {
		return ""
	}
	return f[2]
}

func pskPath(desc string) string { return "\x00psk\x00" + desc }

// setPSKs puts keys in the ring (a key already there with the same payload
// within Recheck is not written again) and clears their payloads.
func (d *Driver) setPSKs(keys map[string][]byte) error {
	for desc, payload := range keys {
		sum := sha256.Sum256(payload)
		if !d.fresh(pskPath(desc), sum) {
			if _, err := d.PSKs.Set(desc, payload); err != nil {
				clearAll(keys)
				return fmt.Errorf("nvmet: install TLS PSK: %w", err)
			}
			d.remember(pskPath(desc), sum)
		}
		clear(payload)
	}
	return nil
}

// removePSK takes desc out of the ring.
func (d *Driver) removePSK(desc string) error {
	d.forget(pskPath(desc))
	if err := d.PSKs.Remove(desc); err != nil {
		return fmt.Errorf("nvmet: remove TLS PSK: %w", err)
	}
	return nil
}

func clearAll(keys map[string][]byte) {
	for _, p := range keys {
		clear(p)
	}
}

// hostSub keys a host's PSK identities on one subsystem.
func hostSub(host, sub string) string { return host + "\x00" + sub }

// putPSKs installs host h's PSK identities on sub (or, for a host without
// a PSK, removes any it had there), and removes identities of an earlier
// PSK (a rotation changes the v1 identity's digest).
func (d *Driver) putPSKs(st *applied, h fabric.Host, sub string) error {
	if h.TLSPSK == "" {
		return d.dropPSKs(st, h.NQN, sub)
	}
	keys, err := pskKeys(h, sub)
	if err != nil {
		return err
	}
	descs := make([]string, 0, len(keys))
	for desc := range keys {
		descs = append(descs, desc)
	}
	if err := d.setPSKs(keys); err != nil {
		return err
	}
	hs := hostSub(h.NQN, sub)
	for _, old := range st.psks[hs] {
		if _, ok := keys[old]; !ok {
			if err := d.removePSK(old); err != nil {
				return err
			}
		}
	}
	st.psks[hs] = descs
	return nil
}

// dropPSKs removes host's PSK identities on sub.
func (d *Driver) dropPSKs(st *applied, host, sub string) error {
	hs := hostSub(host, sub)
	for _, desc := range st.psks[hs] {
		if err := d.removePSK(desc); err != nil {
			return err
		}
	}
	delete(st.psks, hs)
	return nil
}
