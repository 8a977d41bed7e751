package fabric

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// ErrNeedFull is returned by whatever applies a Delta (a driver, the
// stream to a target's agent) when it does not hold the delta's base: it
// has applied no whole state yet, its last application failed, or it holds
// another generation. Nothing was changed; the caller applies the whole
// state instead.
var ErrNeedFull = errors.New("fabric: the delta's base is not what is applied; a whole state is needed")

// NotServedError is returned by a driver's Apply that applied a whole
// state except some of its namespaces: the hosts, subsystems and ports are
// as the state says (removals first), and the driver holds the state (a
// delta on top of it is taken), but each namespace listed is not served as
// the state asks. A namespace the target cannot serve — no dm-crypt for a
// backing device, cryptsetup refusing to open it, a device not wholly
// under its key, the operator's namespace on its NSID — is left not
// exported, never in the clear; one the driver could not take down says
// so (Exported). The caller counts the generation as applied (its grants
// are answered) unless a namespace is still Exported, and tells the
// operators of the namespaces: one namespace must not hold back the
// programming of every tenant on the target.
type NotServedError struct {
	Namespaces []NotServed
}

// NotServed is one namespace a driver did not bring to what the state
// says, and why (no secrets). Subsystem is "" for a dm-crypt mapping whose
// namespace the driver cannot name (Exported).
type NotServed struct {
	Subsystem string
	NSID      uint32
	Reason    string
	// Exported: the driver could not take the namespace down, and it is
	// still exported although the state does not export it (it left the
	// state, or cannot be served as the state says). Unlike a namespace
	// left not exported, this is a removal not done: whoever applies the
	// state does not count it as applied (a crypto-erase waits for the
	// namespace to be down).
	Exported bool
}

func (n NotServed) String() string {
	if n.Subsystem == "" {
		return n.Reason // a mapping whose namespace is not known
	}
	return fmt.Sprintf("namespace %d of %s: %s", n.NSID, n.Subsystem, n.Reason)
}

func (e *NotServedError) Error() string {
	parts := make([]string, len(e.Namespaces))
	for i, n := range e.Namespaces {
		parts[i] = n.String()
	}
	return "fabric: applied, except namespaces not served: " + strings.Join(parts, "; ")
}

// NotServedIn reports whether err is a partial application (a
// *NotServedError, possibly wrapped), and its namespaces.
func NotServedIn(err error) ([]NotServed, bool) {
	var e *NotServedError
	if errors.As(err, &e) {
		return e.Namespaces, true
	}
	return nil, false
}

// State is the desired state of a target, at a generation that grows with
// every change (the agent acknowledges generations).
type State struct {
	Generation uint64
	Subsystems []Subsystem
}

// Delta is a change of a target's desired state: the state at generation
// Base with Hosts applied, in order, is the state at Generation. A delta
// changes host entries only (a grant was issued, renewed, ended); a change
// of subsystems, ports or namespaces comes as a whole State.
type Delta struct {
	Base       uint64
	Generation uint64
	Hosts      []HostChange
}

// HostChange is one host entry of one subsystem: Host is allowed on
// Subsystem with Host's credentials (added, or its credentials changed),
// or, with Remove, the host named Host.NQN is no longer allowed there.
type HostChange struct {
	Subsystem string
	Host      Host
	Remove    bool
}

// String names the change, without its secrets.
func (c HostChange) String() string {
	if c.Remove {
		return fmt.Sprintf("remove host %s from %s", c.Host.NQN, c.Subsystem)
	}
	return fmt.Sprintf("set %s on %s", c.Host, c.Subsystem)
}

// ApplyDelta changes s as d says, for whatever keeps a whole state
// (drivers without deltas of their own, tests). It refuses with
// ErrNeedFull, leaving s as it was, if s is not at d's base generation or
// d names a subsystem s does not have.
func (s *State) ApplyDelta(d Delta) error {
	if s.Generation != d.Base {
		return fmt.Errorf("state at generation %d, delta from %d: %w", s.Generation, d.Base, ErrNeedFull)
	}
	// Copies: the slices may be shared with an earlier state.
	subs := slices.Clone(s.Subsystems)
	for _, c := range d.Hosts {
		i := slices.IndexFunc(subs, func(sub Subsystem) bool { return sub.NQN == c.Subsystem })
		if i < 0 {
			return fmt.Errorf("delta names subsystem %s, which the state does not have: %w", c.Subsystem, ErrNeedFull)
		}
		hosts := slices.DeleteFunc(slices.Clone(subs[i].Hosts), func(h Host) bool { return h.NQN == c.Host.NQN })
		if !c.Remove {
			hosts = append(hosts, c.Host)
			slices.SortFunc(hosts, func(a, b Host) int { return strings.Compare(a.NQN, b.NQN) })
		}
		subs[i].Hosts = hosts
	}
	s.Subsystems, s.Generation = subs, d.Generation
	return nil
}

// Subsystem is one NVM subsystem with the hosts allowed on it and the ports
// it listens on. AllowAnyHost is always false for the subsystems nvmegate
// manages: only the listed hosts may connect.
type Subsystem struct {
	NQN        string
	Hosts      []Host
	Ports      []Port
	Namespaces []Namespace // QoS caps; drivers without QoS ignore them
}

// Namespace is a namespace's QoS caps (0: no cap) and, for a namespace
// the driver exports encrypted at rest, its backing device and data key.
// It prints redacted.
//
// A namespace with a backing device and no data key is held (Held): the
// gateway could not read its data key (its key store is away). A driver
// keeps it as the target has it — exported through the mapping it already
// has, or not at all — and never opens it anew: it has no key to open it
// with, and taking it down would end a tenant's I/O for a blip of the key
// store. (Leaving the namespace out of the state would take it down: a
// driver removes the namespaces of its own that a state does not have.)
// An agent from before held namespaces finds no key to open one with, and
// keeps only a mapping already open (cryptdev.Cryptsetup.Open).
type Namespace struct {
	NSID    uint32
	MaxIOPS uint64
	MaxMBps uint64
	// BackingDevice is the block device holding the namespace; "" leaves
	// the namespace to the operator (drivers neither create nor encrypt it).
	BackingDevice string
	// DataKey is the namespace's data key, unwrapped (secret), with
	// BackingDevice.
	DataKey []byte
	// NextDataKey, while the data key is rotated, is the key the driver
	// re-encrypts the device to (secret), offline: the namespace is not
	// exported until the gateway commits generation NextGeneration.
	NextDataKey    []byte
	NextGeneration uint64
}

// Held reports whether the namespace is to be encrypted at rest and came
// without its data key: the driver keeps it as it is (see Namespace).
func (n Namespace) Held() bool { return n.BackingDevice != "" && len(n.DataKey) == 0 }

// String redacts the data key.
func (n Namespace) String() string {
	if n.BackingDevice == "" {
		return fmt.Sprintf("namespace %d", n.NSID)
	}
	if n.Held() {
		return fmt.Sprintf("namespace %d on %s (held: no data key)", n.NSID, n.BackingDevice)
	}
	if n.NextDataKey != nil {
		return fmt.Sprintf("namespace %d on %s (%d-byte data key redacted; re-encrypting to generation %d)", n.NSID, n.BackingDevice, len(n.DataKey), n.NextGeneration)
	}
	return fmt.Sprintf("namespace %d on %s (%d-byte data key redacted)", n.NSID, n.BackingDevice, len(n.DataKey))
}

// Format prints the namespace redacted for every verb.
func (n Namespace) Format(f fmt.State, _ rune) { io.WriteString(f, n.String()) }

// Host is a host allowed on a subsystem, with its credentials. Host and
// controller secrets are DHHC-1 strings. It prints redacted.
type Host struct {
	NQN           string
	DHCHAPKey     string // DHHC-1 host secret; "" without in-band authentication
	DHCHAPCtrlKey string // DHHC-1 controller secret (bidirectional); "" for none
	DHCHAPHash    string // "hmac(sha256)", "hmac(sha384)", "hmac(sha512)"
	DHCHAPGroup   string // "null" or "ffdhe2048" … "ffdhe8192"
	TLSPSK        string // NVMeTLSkey-1 configured PSK; "" without TLS (drivers that key TLS per host use it)
}

// String redacts the secrets.
func (h Host) String() string {
	return fmt.Sprintf("host %s (%s, %s, secrets redacted)", h.NQN, h.DHCHAPHash, h.DHCHAPGroup)
}

// GoString redacts the secrets for %#v.
func (h Host) GoString() string { return h.String() }

// Port is a transport port, spelled as nvmet's configfs spells it.
type Port struct {
	ID      uint16
	Trtype  string // "tcp", "rdma"
	Adrfam  string // "ipv4", "ipv6"
	Traddr  string
	Trsvcid string
	Treq    string // "not specified", "required", "not required"
	Tsas    string // tcp: "none" or "tls1.3"; "" for other transports
}

// Hash names a DH-HMAC-CHAP hash as nvmet does: "sha384" → "hmac(sha384)".
func Hash(name string) string { return "hmac(" + name + ")" }

// Normalize sorts subsystems, hosts and ports, so that two states with the
// same content compare equal and drivers apply them in a fixed order.
func (s *State) Normalize() {
	slices.SortFunc(s.Subsystems, func(a, b Subsystem) int { return strings.Compare(a.NQN, b.NQN) })
	for i := range s.Subsystems {
		sub := &s.Subsystems[i]
		slices.SortFunc(sub.Hosts, func(a, b Host) int { return strings.Compare(a.NQN, b.NQN) })
		slices.SortFunc(sub.Ports, func(a, b Port) int { return cmp.Compare(a.ID, b.ID) })
	}
}
