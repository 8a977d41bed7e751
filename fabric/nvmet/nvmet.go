package nvmet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
)

// Driver writes the configfs tree under Root. Keep one per target: it
// remembers the host entries and links it wrote and verified, so that an
// Apply touches only what changed instead of reading back every host
// (under a connect storm a target holds thousands).
type Driver struct {
	Root string // e.g. /sys/kernel/config/nvmet
	// Recheck is how long a remembered entry is trusted before it is read
	// back again (default 30 s; negative: always read back). The tree is
	// the agent's alone; this bounds how long a change made behind its
	// back survives.
	Recheck time.Duration
	// PSKs holds the TLS PSKs of hosts granted on TLS ports (the kernel's
	// ".nvme" keyring); nil: this driver lets in no host with a PSK.
	PSKs PSKs
	// Crypt exports namespaces that have a backing device encrypted at
	// rest (cryptdev.Cryptsetup); nil: it exports none of them (never in
	// the clear) and reports them, applying the rest of the state
	// (fabric.NotServedError).
	Crypt Crypt
	// Reencrypt re-encrypts namespaces for data-key rotations
	// (cryptdev.Runner); nil: those namespaces are reported likewise.
	Reencrypt Reencrypter

	mu   sync.Mutex
	seen map[string]seenEntry // path → a digest of what is there, and when it was checked

	// apply serializes Apply and ApplyDelta; state is the host side of
	// the state they last applied (nil: none, or the last one failed).
	apply sync.Mutex
	state *applied
}

// applied is the host side of the state the driver last applied, a whole
// state and the deltas after it: what a delta is checked against, without
// reading the tree or the other hosts.
type applied struct {
	subs  map[string]bool         // the subsystems the state owns
	hosts map[string]*appliedHost // host NQN → its entry
	psks  map[string][]string     // hostSub(host, subsystem) → the PSK identities in the ring
}

// appliedHost is one entry under hosts/: the digest of its credentials,
// and the subsystems (of the state) allowing it, sorted.
type appliedHost struct {
	sum  [32]byte
	subs []string
}

type seenEntry struct {
	sum [32]byte
	at  time.Time
}

func (d *Driver) recheck() time.Duration {
	if d.Recheck == 0 {
		return 30 * time.Second
	}
	return d.Recheck
}

// fresh reports whether path was checked to hold sum recently.
func (d *Driver) fresh(path string, sum [32]byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.seen[path]
	return ok && e.sum == sum && time.Since(e.at) < d.recheck()
}

func (d *Driver) remember(path string, sum [32]byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]seenEntry{}
	}
	d.seen[path] = seenEntry{sum: sum, at: time.Now()}
}

func (d *Driver) forget(path string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.seen, path)
}

// stateSum digests a state's content (secrets included, so a re-key is
// seen; only the digest is kept), not its generation. It streams the
// fields into the hash: a target of 10,000 hosts is megabytes of text,
// and this runs on every programming run.
func stateSum(s fabric.State) ([32]byte, error) {
	h := sha256.New()
	field := func(v string) {
		// Length-prefixed: no two states hash the same input.
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(v)))])
		io.WriteString(h, v)
	}
	num := func(v uint64) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], v)])
	}
	num(uint64(len(s.Subsystems)))
	for _, sub := range s.Subsystems {
		field(sub.NQN)
		num(uint64(len(sub.Hosts)))
		for _, x := range sub.Hosts {
			field(x.NQN)
			field(x.DHCHAPKey)
			field(x.DHCHAPCtrlKey)
			field(x.DHCHAPHash)
			field(x.DHCHAPGroup)
			field(x.TLSPSK)
		}
		num(uint64(len(sub.Ports)))
		for _, p := range sub.Ports {
			num(uint64(p.ID))
			field(p.Trtype)
			field(p.Adrfam)
			field(p.Traddr)
			field(p.Trsvcid)
			field(p.Treq)
			field(p.Tsas)
		}
		num(uint64(len(sub.Namespaces)))
		for _, n := range sub.Namespaces {
			num(uint64(n.NSID))
			num(n.MaxIOPS)
			num(n.MaxMBps)
			field(n.BackingDevice)
			field(string(n.DataKey))
			field(string(n.NextDataKey))
			num(n.NextGeneration)
		}
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

// hostSum digests a host entry (secrets included, so a re-key is seen;
// only the digest is kept).
func hostSum(h fabric.Host) [32]byte {
	return sha256.Sum256([]byte(strings.Join([]string{h.NQN, h.DHCHAPKey, h.DHCHAPCtrlKey, h.DHCHAPHash, h.DHCHAPGroup, h.TLSPSK}, "\x00")))
}

// stateKey is where the driver remembers the last state it applied whole.
const stateKey = "\x00state"

// Apply makes the tree match s for the subsystems in s. The same state as
// the last one applied (its generation aside) is not applied again within
// Recheck: under load most programming runs change nothing on the target
// (a node reconnecting gets the host entry it had), and walking the tree
// was most of their cost.
//
// The order is the one that keeps a revocation from waiting on anything
// else: what can be checked is checked before anything is written; then
// removals (hosts' links the state no longer has, then hosts no subsystem
// allows); then host entries, subsystems and ports; namespaces last. A
// namespace the target cannot serve (no dm-crypt, cryptsetup refusing it,
// see writeNamespaces) is left not exported and listed in a
// *fabric.NotServedError returned once everything else is applied: the
// driver then holds the state (deltas on top of it are taken), and does
// not remember it as applied, so that the next whole state tries those
// namespaces again.
func (d *Driver) Apply(ctx context.Context, s fabric.State) (err error) {
	d.apply.Lock()
	defer d.apply.Unlock()
	s.Normalize()
	sum, err := stateSum(s)
	if err != nil {
		return err
	}
	if d.state != nil && d.fresh(stateKey, sum) {
		return nil
	}
	d.forget(stateKey)
	d.state = nil
	st := &applied{subs: map[string]bool{}, hosts: map[string]*appliedHost{}, psks: map[string][]string{}}
	defer func() {
		if _, partial := fabric.NotServedIn(err); err == nil || partial {
			d.state = st
		}
		if err == nil {
			d.remember(stateKey, sum)
		}
	}()
	for _, dir := range []string{"hosts", "subsystems", "ports"} {
		if err := mkdir(filepath.Join(d.Root, dir)); err != nil {
			return err
		}
	}
	wanted := map[string]fabric.Host{} // host NQN → credentials
	for _, sub := range s.Subsystems {
		st.subs[sub.NQN] = true // the subsystems this state owns
		for _, h := range sub.Hosts {
			if err := d.checkHost(h, sub.NQN); err != nil {
				return err
			}
			e := st.hosts[h.NQN]
			if e == nil {
				e = &appliedHost{sum: hostSum(h)}
				st.hosts[h.NQN] = e
			} else if prev := wanted[h.NQN]; prev != h {
				return errConflict(h.NQN)
			}
			e.subs = append(e.subs, sub.NQN) // in subsystem order: sorted
			wanted[h.NQN] = h
		}
	}
	// Removals first: a host the state no longer allows on a subsystem
	// loses its link there, and a host no subsystem allows loses its
	// entry (after its links), before anything is added or exported.
	for _, sub := range s.Subsystems {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := d.pruneHosts(sub); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(filepath.Join(d.Root, "hosts"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if _, ok := wanted[e.Name()]; !ok {
			dir := filepath.Join(d.Root, "hosts", e.Name())
			d.forget(dir)
			if err := rmdir(dir); err != nil {
				return err
			}
		}
	}
	for _, h := range wanted {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := d.writeHost(h, st.hosts[h.NQN].sum, st.subs); err != nil {
			return err
		}
	}
	portSubs := map[uint16]map[string]bool{} // the subsystems each port serves
	for _, sub := range s.Subsystems {
		if err := d.writeSubsystem(sub); err != nil {
			return err
		}
		for _, p := range sub.Ports {
			if portSubs[p.ID] == nil {
				portSubs[p.ID] = map[string]bool{}
			}
			portSubs[p.ID][sub.NQN] = true
		}
	}
	for id, subs := range portSubs {
		if err := d.prune(filepath.Join(d.Root, "ports", strconv.Itoa(int(id)), "subsystems"), subs); err != nil {
			return err
		}
	}
	if err := d.syncPSKs(s, st); err != nil {
		return err
	}
	// Namespaces of ours last: mapped, then enabled (nvmet serves a
	// namespace enabled after its ports were). One that cannot be served
	// is reported, not a failure of the whole state.
	var notServed []fabric.NotServed
	mapped := map[string]bool{} // the dm-crypt mappings in use
	for _, sub := range s.Subsystems {
		if err := ctx.Err(); err != nil {
			return err
		}
		ns, err := d.writeNamespaces(sub, mapped)
		if err != nil {
			return err
		}
		notServed = append(notServed, ns...)
	}
	stuck, err := d.closeUnused(mapped)
	if err != nil {
		return err
	}
	notServed = append(notServed, stuck...)
	if len(notServed) > 0 {
		return &fabric.NotServedError{Namespaces: notServed}
	}
	return nil
}

// pruneHosts removes the allowed_hosts links of sub to hosts sub no longer
// allows (a subsystem not made yet has none).
func (d *Driver) pruneHosts(sub fabric.Subsystem) error {
	dir := filepath.Join(d.Root, "subsystems", sub.NQN, "allowed_hosts")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	keep := make(map[string]bool, len(sub.Hosts))
	for _, h := range sub.Hosts {
		keep[h.NQN] = true
	}
	return d.prune(dir, keep)
}

// syncPSKs makes the ring hold exactly the PSK identities of the state's
// TLS hosts on the subsystems it owns; keys of other subsystems are not
// ours and stay.
func (d *Driver) syncPSKs(s fabric.State, st *applied) error {
	if d.PSKs == nil {
		return nil // checkHost let no host with a PSK through
	}
	want := map[string]bool{}
	for _, sub := range s.Subsystems {
		for _, h := range sub.Hosts {
			if h.TLSPSK == "" {
				continue
			}
			keys, err := pskKeys(h, sub.NQN)
			if err != nil {
				return err
			}
			for desc := range keys {
				want[desc] = true
				st.psks[hostSub(h.NQN, sub.NQN)] = append(st.psks[hostSub(h.NQN, sub.NQN)], desc)
			}
			if err := d.setPSKs(keys); err != nil {
				return err
			}
		}
	}
	have, err := d.PSKs.List()
	if err != nil {
		return fmt.Errorf("nvmet: list TLS PSKs: %w", err)
	}
	for desc := range have {
		if !want[desc] && st.subs[pskSubsystem(desc)] {
			if err := d.removePSK(desc); err != nil {
				return err
			}
		}
	}
	return nil
}

// ApplyDelta applies a change of host entries to the state last applied,
// touching only the hosts it names: each one's entry under hosts/ is
// written (or made anew, when its controller key goes; see dropCtrlKey),
// linked from the subsystems that now allow it, unlinked from those that
// no longer do, and removed when none does. Nothing else is read: the
// driver checks the delta against what it applied (a host keeps one set
// of credentials across the subsystems of the target, as Apply checks).
//
// It refuses with fabric.ErrNeedFull, writing nothing, before a whole state
// was applied, after an application failed (the tree is then between
// states), and for a subsystem the applied state does not have (an
// inventory change comes as a whole state). A host the delta would leave
// with two sets of credentials is refused, also before anything is
// written.
func (d *Driver) ApplyDelta(ctx context.Context, dl fabric.Delta) (err error) {
	d.apply.Lock()
	defer d.apply.Unlock()
	st := d.state
	if st == nil {
		return fmt.Errorf("nvmet: no whole state applied: %w", fabric.ErrNeedFull)
	}
	// Each host the delta names, as it will be: the subsystems allowing
	// it, each with the digest of the credentials it allows it with.
	type hostChange struct {
		old   *appliedHost
		subs  map[string][32]byte
		hosts map[[32]byte]fabric.Host // the credentials set, by digest
		set   map[string]fabric.Host   // the subsystems the delta sets the host on
	}
	var order []string
	changes := map[string]*hostChange{}
	for _, c := range dl.Hosts {
		if !st.subs[c.Subsystem] {
			return fmt.Errorf("nvmet: subsystem %s is not in the applied state: %w", c.Subsystem, fabric.ErrNeedFull)
		}
		ch := changes[c.Host.NQN]
		if ch == nil {
			ch = &hostChange{old: st.hosts[c.Host.NQN], subs: map[string][32]byte{}, hosts: map[[32]byte]fabric.Host{}, set: map[string]fabric.Host{}}
			if ch.old != nil {
				for _, s := range ch.old.subs {
					ch.subs[s] = ch.old.sum
				}
			}
			changes[c.Host.NQN] = ch
			order = append(order, c.Host.NQN)
		}
		if c.Remove {
			delete(ch.subs, c.Subsystem)
			delete(ch.set, c.Subsystem)
			continue
		}
		if err := d.checkHost(c.Host, c.Subsystem); err != nil {
			return err
		}
		sum := hostSum(c.Host)
		ch.subs[c.Subsystem], ch.hosts[sum], ch.set[c.Subsystem] = sum, c.Host, c.Host
	}
	final := make([][32]byte, len(order))
	for i, nqn := range order {
		first := true
		for _, sum := range changes[nqn].subs {
			if !first && sum != final[i] {
				return errConflict(nqn)
			}
			final[i], first = sum, false
		}
	}
	if len(order) == 0 {
		return nil
	}
	// The tree changes: it no longer holds the last whole state, nor, until
	// this delta is applied whole, any state.
	d.forget(stateKey)
	d.state = nil
	defer func() {
		if err == nil {
			d.state = st
		}
	}()
	for i, nqn := range order {
		if err := ctx.Err(); err != nil {
			return err
		}
		ch := changes[nqn]
		if ch.old != nil {
			for _, s := range ch.old.subs {
				if _, ok := ch.subs[s]; !ok {
					if err := d.unlink(filepath.Join(d.Root, "subsystems", s, "allowed_hosts", nqn)); err != nil {
						return err
					}
				}
			}
		}
		if ch.old != nil {
			for _, s := range ch.old.subs {
				if _, ok := ch.subs[s]; !ok {
					if err := d.dropPSKs(st, nqn, s); err != nil {
						return err
					}
				}
			}
		}
		dir := filepath.Join(d.Root, "hosts", nqn)
		if len(ch.subs) == 0 {
			delete(st.hosts, nqn)
			d.forget(dir)
			if err := rmdir(dir); err != nil {
				return err
			}
			continue
		}
		if ch.old == nil || ch.old.sum != final[i] {
			if err := d.writeHost(ch.hosts[final[i]], final[i], st.subs); err != nil {
				return err
			}
		}
		e := &appliedHost{sum: final[i]}
		for s := range ch.subs {
			e.subs = append(e.subs, s)
		}
		slices.Sort(e.subs)
		// Linked again where it stays, too: dropping a controller key
		// unlinks the host everywhere.
		for _, s := range e.subs {
			if err := d.link(filepath.Join("..", "..", "..", "hosts", nqn), filepath.Join(d.Root, "subsystems", s, "allowed_hosts", nqn)); err != nil {
				return err
			}
		}
		st.hosts[nqn] = e
		for s, h := range ch.set {
			if err := d.putPSKs(st, h, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// unlink removes a link the driver made, if it is there.
func (d *Driver) unlink(path string) error {
	d.forget(path)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nvmet: unlink %s: %w", strings.TrimPrefix(path, d.Root+"/"), unwrapPath(err))
	}
	return nil
}

// checkHost refuses a host entry this driver cannot make safe. Fail
// closed: an entry without a DH-HMAC-CHAP key would let anyone presenting
// its (not secret) NQN in. That holds on TLS ports too: nvmet does not
// check that the PSK a queue's TLS session was keyed with names the host
// NQN its Connect command claims (Linux 6.12 keeps the PSK's serial, never
// compares its identity), so a host holding any PSK the target knows could
// connect as another host; DH-HMAC-CHAP inside the TLS session is what
// authenticates the host NQN. A host with a PSK needs a keyring for it.
func (d *Driver) checkHost(h fabric.Host, sub string) error {
	if h.DHCHAPKey == "" {
		return fmt.Errorf("nvmet: host %s on %s has no DH-HMAC-CHAP key; nvmet would admit it unauthenticated", h.NQN, sub)
	}
	if h.TLSPSK != "" && d.PSKs == nil {
		return fmt.Errorf("nvmet: host %s on %s needs a TLS PSK, and this driver has no keyring to install it in", h.NQN, sub)
	}
	return nil
}

// errConflict: configfs has one hosts/<nqn> entry per target, so a host's
// keys are the same on every subsystem of a target.
func errConflict(host string) error {
	return fmt.Errorf("nvmet: host %s has different credentials on two subsystems", host)
}

// writeHost makes the entry hosts/<nqn> hold h's credentials (sum is
// hostSum(h)); managed are the subsystems the applied state owns.
func (d *Driver) writeHost(h fabric.Host, sum [32]byte, managed map[string]bool) (err error) {
	dir := filepath.Join(d.Root, "hosts", h.NQN)
	if d.fresh(dir, sum) {
		return nil
	}
	defer func() {
		if err == nil {
			d.remember(dir, sum)
		} else {
			d.forget(dir)
		}
	}()
	if h.DHCHAPCtrlKey == "" {
		if err := d.dropCtrlKey(dir, managed); err != nil {
			return err
		}
	}
	if err := mkdir(dir); err != nil {
		return err
	}
	for _, a := range []struct {
		name, value string
		secret      bool
	}{
		{"dhchap_key", h.DHCHAPKey, true},
		{"dhchap_ctrl_key", h.DHCHAPCtrlKey, true},
		{"dhchap_hash", h.DHCHAPHash, false},
		{"dhchap_dhgroup", h.DHCHAPGroup, false},
	} {
		if a.value == "" {
			// configfs refuses an empty key (nvmet_auth_set_key wants
			// "DHHC-1:"): an attribute not asked for is not written.
			continue
		}
		if err := writeAttr(filepath.Join(dir, a.name), a.value, a.secret); err != nil {
			return err
		}
	}
	return nil
}

// dropCtrlKey clears the controller key of a host entry that no longer
// has one (its grant became unidirectional). configfs cannot clear it —
// Linux 6.1's nvmet_auth_set_key refuses anything but a DHHC-1 key — and
// a host entry linked from a subsystem cannot be removed (EBUSY), so the
// entry's links go, then the entry; Apply then makes it anew and links it
// again. Live connections stay: nvmet checks allowed_hosts only when a
// queue connects. A host also linked from a subsystem this state does not
// own keeps its entry (and the stale key): its links there are not ours
// to remake.
func (d *Driver) dropCtrlKey(dir string, managed map[string]bool) error {
	cur, err := os.ReadFile(filepath.Join(dir, "dhchap_ctrl_key"))
	if err != nil || len(bytes.TrimSpace(cur)) == 0 {
		return nil // no entry yet, or no controller key
	}
	subs, err := os.ReadDir(filepath.Join(d.Root, "subsystems"))
	if err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	var links []string
	for _, sub := range subs {
		l := filepath.Join(d.Root, "subsystems", sub.Name(), "allowed_hosts", filepath.Base(dir))
		if _, err := os.Lstat(l); err != nil {
			continue
		}
		if !managed[sub.Name()] {
			return nil
		}
		links = append(links, l)
	}
	for _, l := range links {
		d.forget(l)
		if err := os.Remove(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("nvmet: unlink %s: %w", strings.TrimPrefix(l, d.Root+"/"), unwrapPath(err))
		}
	}
	return rmdir(dir)
}

func (d *Driver) writeSubsystem(sub fabric.Subsystem) error {
	dir := filepath.Join(d.Root, "subsystems", sub.NQN)
	if err := mkdir(filepath.Join(dir, "allowed_hosts")); err != nil {
		return err
	}
	if err := writeAttr(filepath.Join(dir, "attr_allow_any_host"), "0", false); err != nil {
		return err
	}
	hosts := map[string]bool{}
	for _, h := range sub.Hosts {
		hosts[h.NQN] = true
		if err := d.link(filepath.Join("..", "..", "..", "hosts", h.NQN), filepath.Join(dir, "allowed_hosts", h.NQN)); err != nil {
			return err
		}
	}
	if err := d.prune(filepath.Join(dir, "allowed_hosts"), hosts); err != nil {
		return err
	}
	for _, p := range sub.Ports {
		pdir := filepath.Join(d.Root, "ports", strconv.Itoa(int(p.ID)))
		if err := mkdir(filepath.Join(pdir, "subsystems")); err != nil {
			return err
		}
		// In this order (Linux 6.12, configfs.c): writing addr_trtype
		// resets addr_tsas, and addr_tsas "tls1.3" sets addr_treq to
		// "required" (a TLS port refuses "not specified"); all of them
		// only before the port is enabled, when its first subsystem is
		// linked below.
		for _, a := range [...]struct{ name, v string }{{"addr_trtype", p.Trtype}, {"addr_adrfam", p.Adrfam},
			{"addr_traddr", p.Traddr}, {"addr_trsvcid", p.Trsvcid}, {"addr_tsas", p.Tsas}, {"addr_treq", p.Treq}} {
			name, v := a.name, a.v
			if name == "addr_tsas" && (v == "" || v == "none") {
				// Kernels before 6.7 have no addr_tsas (found on a real
				// 6.1 target: the write fails), and on later ones "none"
				// is a TCP port's default. Only a TLS port writes it, and
				// fails closed where the kernel cannot do TLS.
				continue
			}
			if err := writeAttr(filepath.Join(pdir, name), v, false); err != nil {
				return err
			}
		}
		if err := d.link(filepath.Join("..", "..", "..", "subsystems", sub.NQN), filepath.Join(pdir, "subsystems", sub.NQN)); err != nil {
			return err
		}
	}
	return nil
}

func mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	return nil
}

// writeAttr writes value (with a newline, as configfs shows it) unless
// the file already holds it.
func writeAttr(path, value string, secret bool) error {
	want := []byte(value + "\n")
	if old, err := os.ReadFile(path); err == nil && (bytes.Equal(old, want) || bytes.Equal(old, []byte(value))) {
		return nil
	}
	mode := os.FileMode(0o644)
	if secret {
		mode = 0o600
	}
	if err := os.WriteFile(path, want, mode); err != nil {
		// Never the value: it may be a secret.
		return fmt.Errorf("nvmet: write %s: %w", filepath.Base(path), unwrapPath(err))
	}
	return nil
}

// unwrapPath drops the *PathError wrapper (its path is already named).
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// link makes newname a symlink to target (a path relative to newname's
// directory), replacing a wrong one. Both facts below were found on a real
// Linux 6.1 target:
//
//   - configfs resolves a new link's target from the calling process's
//     working directory, not from the link's (a relative target fails with
//     ENOENT), so the link is made with the absolute path;
//   - configfs answers readlink with a relative path of its own making, up
//     to its mount point and down again ("../../../../nvmet/hosts/<nqn>"),
//     so a link is right when it leads to the same place. Comparing the
//     text would relink on every Apply, and unlinking a port's subsystem
//     drops the connections through it.
func (d *Driver) link(target, newname string) (err error) {
	dir, err := filepath.Abs(filepath.Dir(newname))
	if err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	abs := filepath.Join(dir, target)
	sum := sha256.Sum256([]byte(abs))
	if d.fresh(newname, sum) {
		return nil
	}
	defer func() {
		if err == nil {
			d.remember(newname, sum)
		} else {
			d.forget(newname)
		}
	}()
	if cur, err := os.Readlink(newname); err == nil {
		if !filepath.IsAbs(cur) {
			cur = filepath.Join(dir, cur)
		}
		if cur == abs {
			return nil
		}
		if err := os.Remove(newname); err != nil {
			return fmt.Errorf("nvmet: %w", err)
		}
	}
	if err := os.Symlink(abs, newname); err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	return nil
}

// prune removes the links in dir whose names keep does not hold.
func (d *Driver) prune(dir string, keep map[string]bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("nvmet: %w", err)
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			d.forget(filepath.Join(dir, e.Name()))
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("nvmet: %w", err)
			}
		}
	}
	return nil
}

// rmdir removes a configfs item: rmdir is enough on configfs (attributes
// go with it); a plain directory needs its files removed first.
func rmdir(dir string) error {
	err := syscall.Rmdir(dir)
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		err = os.RemoveAll(dir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nvmet: remove %s: %w", strings.TrimPrefix(dir, "/"), unwrapPath(err))
	}
	return nil
}
