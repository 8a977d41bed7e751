package nvmefmt

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/uuid"

	"github.com/nvmegate/nvmegate"
)

// Connection is what a host needs to connect to one subsystem under a grant:
// the identities, the ports, and the secrets. It renders as a libnvme
// config.json document (ConfigJSON) and as `nvme connect` arguments
// (ConnectArgs). Both carry the secrets: never log them.
type Connection struct {
	HostNQN      string
	HostID       string // UUID; HostID(HostNQN) if empty
	SubsystemNQN string
	Ports        []Endpoint
	// DHCHAPKey is the host's DH-HMAC-CHAP secret (DHHC-1), and
	// DHCHAPCtrlKey the controller's for bidirectional authentication.
	DHCHAPKey     string
	DHCHAPCtrlKey string
	// TLS asks for an NVMe/TCP TLS secure channel; TLSKey is the PSK in the
	// interchange format (NVMeTLSkey-1) and TLSKeyIdentity its identity.
	TLS            bool
	TLSKey         string
	TLSKeyIdentity string
}

// Endpoint is one transport address of the subsystem.
type Endpoint struct {
	Transport string // "tcp" or "rdma"
	Address   string // traddr: an IP address
	ServiceID string // trsvcid: the port number
}

// Validate checks every field, including that the secrets parse. Errors name
// the field, never a secret.
func (c *Connection) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConnection, fmt.Sprintf(format, args...))
	}
	if err := nvmegate.ValidateNQN("host_nqn", c.HostNQN); err != nil {
		return fmt.Errorf("%w: %v", ErrConnection, err)
	}
	if err := nvmegate.ValidateNQN("subsystem_nqn", c.SubsystemNQN); err != nil {
		return fmt.Errorf("%w: %v", ErrConnection, err)
	}
	if c.HostID != "" {
		if _, err := uuid.Parse(c.HostID); err != nil || len(c.HostID) != 36 {
			return bad("host_id must be a 36-character UUID")
		}
	}
	if len(c.Ports) == 0 {
		return bad("at least one port is required")
	}
	for i, p := range c.Ports {
		if p.Transport != nvmegate.TransportTCP && p.Transport != nvmegate.TransportRDMA {
			return bad("ports[%d].transport must be tcp or rdma", i)
		}
		if _, err := netip.ParseAddr(p.Address); err != nil {
			return bad("ports[%d].address must be an IP address", i)
		}
		if n, err := strconv.ParseUint(p.ServiceID, 10, 16); err != nil || n == 0 {
			return bad("ports[%d].service_id must be a port number 1-65535", i)
		}
		if c.TLS && p.Transport != nvmegate.TransportTCP {
			return bad("ports[%d]: TLS needs the tcp transport", i)
		}
	}
	if c.DHCHAPCtrlKey != "" && c.DHCHAPKey == "" {
		return bad("dhchap_ctrl_key needs dhchap_key: the controller authenticates only after the host")
	}
	for _, k := range []struct{ field, v string }{{"dhchap_key", c.DHCHAPKey}, {"dhchap_ctrl_key", c.DHCHAPCtrlKey}} {
		if k.v == "" {
			continue
		}
		if _, err := ParseDHCHAP(k.v); err != nil {
			return bad("%s: %v", k.field, err)
		}
	}
	if c.TLSKey != "" {
		if !c.TLS {
			return bad("tls_key needs tls")
		}
		if _, err := ParseTLSPSK(c.TLSKey); err != nil {
			return bad("tls_key: %v", err)
		}
	}
	if c.TLSKeyIdentity != "" && c.TLSKey == "" {
		return bad("tls_key_identity needs tls_key")
	}
	if c.DHCHAPKey == "" && !c.TLS {
		return bad("a connection needs DH-HMAC-CHAP, TLS or both")
	}
	return nil
}

func (c *Connection) hostID() string {
	if c.HostID != "" {
		return c.HostID
	}
	return HostID(c.HostNQN)
}

// The libnvme config.json schema (libnvme doc/config-schema.json): an array
// of hosts, each with subsystems, each with ports. Secrets go on the port,
// where they are per (host, subsystem) as nvmegate derives them.
type configHost struct {
	HostNQN    string            `json:"hostnqn"`
	HostID     string            `json:"hostid"`
	Subsystems []configSubsystem `json:"subsystems"`
}

type configSubsystem struct {
	NQN   string       `json:"nqn"`
	Ports []configPort `json:"ports"`
}

type configPort struct {
	Transport      string `json:"transport"`
	Traddr         string `json:"traddr"`
	Trsvcid        string `json:"trsvcid"`
	DHCHAPKey      string `json:"dhchap_key,omitempty"`
	DHCHAPCtrlKey  string `json:"dhchap_ctrl_key,omitempty"`
	TLS            bool   `json:"tls,omitempty"`
	TLSKey         string `json:"tls_key,omitempty"`
	TLSKeyIdentity string `json:"tls_key_identity,omitempty"`
}

// ConfigJSON renders the connection as a libnvme config.json document (one
// host, one subsystem, one entry per port), for `nvme connect-all -J` or
// /etc/nvme/config.json. libnvme reads tls_key from 1.4 and
// tls_key_identity from 1.11 on (checked in its history); older versions
// ignore them, and Debian 12's libnvme 1.3 drops both.
func (c *Connection) ConfigJSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	sub := configSubsystem{NQN: c.SubsystemNQN}
	for _, p := range c.Ports {
		sub.Ports = append(sub.Ports, configPort{
			Transport: p.Transport, Traddr: p.Address, Trsvcid: p.ServiceID,
			DHCHAPKey: c.DHCHAPKey, DHCHAPCtrlKey: c.DHCHAPCtrlKey,
			TLS: c.TLS, TLSKey: c.TLSKey, TLSKeyIdentity: c.TLSKeyIdentity,
		})
	}
	doc := []configHost{{HostNQN: c.HostNQN, HostID: c.hostID(), Subsystems: []configSubsystem{sub}}}
	return json.MarshalIndent(doc, "", "  ")
}

// ConnectArgs returns the arguments of `nvme connect` (after "connect") for
// port i, in the long --option=value form that nvme-cli 2.x and 3.x accept.
// --tls-key needs nvme-cli 2.11 or newer (Debian 12's
// nvme-cli 2.3 has no TLS options). nvme-cli 3 renamed --dhchap-secret to
// --kxchap-secret and still accepts the old names.
func (c *Connection) ConnectArgs(i int) ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if i < 0 || i >= len(c.Ports) {
		return nil, fmt.Errorf("%w: no port %d", ErrConnection, i)
	}
	p := c.Ports[i]
	args := []string{
		"--transport=" + p.Transport,
		"--traddr=" + p.Address,
		"--trsvcid=" + p.ServiceID,
		"--nqn=" + c.SubsystemNQN,
		"--hostnqn=" + c.HostNQN,
		"--hostid=" + c.hostID(),
	}
	if c.DHCHAPKey != "" {
		args = append(args, "--dhchap-secret="+c.DHCHAPKey)
	}
	if c.DHCHAPCtrlKey != "" {
		args = append(args, "--dhchap-ctrl-secret="+c.DHCHAPCtrlKey)
	}
	if c.TLS {
		args = append(args, "--tls")
	}
	if c.TLSKey != "" {
		args = append(args, "--tls-key="+c.TLSKey)
	}
	// No --tls-key-identity: given one, nvme-cli up to 2.15 files the PSK
	// it derives with its own (non-RFC) labels under that identity, and
	// the target, keyed per RFC 8446, refuses the handshake (seen with
	// Debian 13's nvme-cli 2.13 on Linux 6.12). Without it every nvme-cli
	// derives the identity and its key consistently, and nvmet targets
	// hold both derivations (fabric/nvmet).
	return args, nil
}
