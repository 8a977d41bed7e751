package fabric

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
)

// Driver programs one target. Apply makes the target match s exactly for
// the subsystems it manages; it is idempotent.
type Driver interface {
	Apply(ctx context.Context, s State) error
}

// State is the desired state of a target, at a generation that grows with
// every change (the agent acknowledges generations).
type State struct {
	Generation uint64
	Subsystems []Subsystem
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

// Namespace is a namespace's QoS caps (0: no cap).
type Namespace struct {
	NSID    uint32
	MaxIOPS uint64
	MaxMBps uint64
}

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
