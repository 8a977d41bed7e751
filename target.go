package nvmegate

import (
	"net/netip"
	"strconv"
	"time"
)

// Target drivers: how the target agent programs a storage server.
const (
	DriverNVMet = "nvmet" // Linux kernel target through configfs
	DriverSPDK  = "spdk"  // SPDK nvmf_tgt through JSON-RPC
)

// Transports and address families, spelled as nvmet's configfs spells them
// (addr_trtype, addr_adrfam).
const (
	TransportTCP  = "tcp"
	TransportRDMA = "rdma"
	FamilyIPv4    = "ipv4"
	FamilyIPv6    = "ipv6"
)

// Secure-channel settings of a port (NVMe/TCP TLS, TP 8011). They map onto
// the discovery log's treq and the TCP tsas fields.
const (
	SecureChannelNone     = "none"     // no TLS listener; treq not required
	SecureChannelOptional = "optional" // TLS 1.3 offered; treq not required
	SecureChannelRequired = "required" // TLS 1.3 only; treq required
)

// Target is a storage server exporting NVMe-oF subsystems, reached by its
// target agent (spiffe://<td>/target/<id>).
type Target struct {
	ID        string    // DNS label, unique; the agent's SPIFFE ID path ends in it
	Fabric    string    // fabric (network domain) the ports are on
	Region    string    // where the server physically is, for residency
	Rack      string    // optional, for placement and reporting
	Driver    string    // DriverNVMet or DriverSPDK
	Ports     []Port    // at least one
	CreatedAt time.Time // set by the store
}

// Port is one NVMe-oF listener of a target.
type Port struct {
	ID            uint16 // nvmet port ID, unique within the target, 1-65535
	Transport     string // TransportTCP or TransportRDMA
	AddressFamily string // FamilyIPv4 or FamilyIPv6
	Address       string // traddr: an IP address of that family
	ServiceID     string // trsvcid: the TCP port, e.g. "4420"
	SecureChannel string // SecureChannel*; "" means none
	// Subnet is the fabric subnet the port serves (a canonical CIDR
	// prefix holding Address, e.g. "10.0.1.0/24"); "" is none, and such
	// a port is reachable only by nodes without a segment
	// (HostBinding.Reaches).
	Subnet string
}

// Validate checks the target on its own; the store checks uniqueness.
func (t *Target) Validate() error {
	if err := ValidateLabel("id", t.ID); err != nil {
		return err
	}
	if err := ValidateLabel("fabric", t.Fabric); err != nil {
		return err
	}
	if err := ValidateLabel("region", t.Region); err != nil {
		return err
	}
	if t.Rack != "" {
		if err := ValidateLabel("rack", t.Rack); err != nil {
			return err
		}
	}
	switch t.Driver {
	case DriverNVMet, DriverSPDK:
	case "":
		return Invalid("driver", "is required (nvmet or spdk)")
	default:
		return Invalid("driver", "must be nvmet or spdk (got %s)", show(t.Driver))
	}
	if len(t.Ports) == 0 {
		return Invalid("ports", "at least one port is required")
	}
	seen := make(map[uint16]bool, len(t.Ports))
	for i := range t.Ports {
		p := &t.Ports[i]
		field := "ports[" + strconv.Itoa(i) + "]"
		if err := p.Validate(); err != nil {
			return WithFieldPrefix(field, err)
		}
		if seen[p.ID] {
			return Invalid(field+".id", "port %d appears twice", p.ID)
		}
		seen[p.ID] = true
	}
	return nil
}

// Port returns the port with the given ID.
func (t *Target) Port(id uint16) (Port, bool) {
	for _, p := range t.Ports {
		if p.ID == id {
			return p, true
		}
	}
	return Port{}, false
}

// Validate checks one port.
func (p *Port) Validate() error {
	if p.ID == 0 {
		return Invalid("id", "must be 1-65535")
	}
	switch p.Transport {
	case TransportTCP, TransportRDMA:
	case "":
		return Invalid("transport", "is required (tcp or rdma)")
	default:
		return Invalid("transport", "must be tcp or rdma (got %s)", show(p.Transport))
	}
	if p.Address == "" {
		return Invalid("address", "is required")
	}
	addr, err := netip.ParseAddr(p.Address)
	if err != nil || addr.Zone() != "" {
		return Invalid("address", "must be an IP address without zone (got %s)", show(p.Address))
	}
	switch p.AddressFamily {
	case FamilyIPv4:
		if !addr.Is4() {
			return Invalid("address", "must be an IPv4 address for address_family ipv4 (got %s)", show(p.Address))
		}
	case FamilyIPv6:
		if !addr.Is6() || addr.Is4In6() {
			return Invalid("address", "must be an IPv6 address for address_family ipv6 (got %s)", show(p.Address))
		}
	case "":
		return Invalid("address_family", "is required (ipv4 or ipv6)")
	default:
		return Invalid("address_family", "must be ipv4 or ipv6 (got %s)", show(p.AddressFamily))
	}
	n, err := strconv.ParseUint(p.ServiceID, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != p.ServiceID {
		return Invalid("service_id", "must be a TCP port number 1-65535 without leading zeros (got %s)", show(p.ServiceID))
	}
	switch p.SecureChannel {
	case "", SecureChannelNone, SecureChannelOptional, SecureChannelRequired:
	default:
		return Invalid("secure_channel", "must be none, optional or required (got %s)", show(p.SecureChannel))
	}
	if p.SecureChannel != "" && p.SecureChannel != SecureChannelNone && p.Transport != TransportTCP {
		return Invalid("secure_channel", "TLS secure channels exist only for the tcp transport")
	}
	if p.Subnet != "" {
		pfx, err := ParseSubnet("subnet", p.Subnet)
		if err != nil {
			return err
		}
		if !pfx.Contains(addr) {
			return Invalid("subnet", "must contain the port's address %s (got %s)", p.Address, show(p.Subnet))
		}
	}
	return nil
}

// ParseSubnet parses a fabric subnet: a CIDR prefix in canonical form (its
// host bits zero, as netip.Prefix.Masked writes it).
func ParseSubnet(field, v string) (netip.Prefix, error) {
	pfx, err := netip.ParsePrefix(v)
	if err != nil || pfx.Addr().Zone() != "" || pfx.Addr().Is4In6() {
		return netip.Prefix{}, Invalid(field, "must be a CIDR prefix like 10.0.1.0/24 (got %s)", show(v))
	}
	if m := pfx.Masked(); m != pfx {
		return netip.Prefix{}, Invalid(field, "must be written canonically, %s (got %s)", m, show(v))
	}
	return pfx, nil
}

// TLS reports whether the port offers a TLS secure channel.
func (p *Port) TLS() bool {
	return p.SecureChannel == SecureChannelOptional || p.SecureChannel == SecureChannelRequired
}
