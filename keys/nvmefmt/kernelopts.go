package nvmefmt

import (
	"fmt"
	"strconv"
	"strings"
)

// KernelOptions renders port i of the connection as the option string the
// Linux NVMe host takes on /dev/nvme-fabrics (drivers/nvme/host/fabrics.c,
// the string libnvme writes for `nvme connect`): comma-separated key=value
// pairs, the secrets inline. It carries the secrets: never log it.
//
// With TLS, keyring is the serial of the keyring the kernel searches, at
// every (re)connect, for the PSK of the identity "NVMe0R<hh> <hostnqn>
// <subnqn>"; no tls_key is named, so that a PSK replaced in the ring after
// a rotation is the one the next reconnect uses (a named key would be held
// by the controller, and reconnects would present the old one).
//
// duplicate asks for a controller beside a live one to the same subsystem,
// port and host (duplicate_connect): a second path, which native
// multipath puts under the same block device.
func (c *Connection) KernelOptions(i, keyring int, duplicate bool) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	if i < 0 || i >= len(c.Ports) {
		return "", fmt.Errorf("%w: no port %d", ErrConnection, i)
	}
	if c.TLS && keyring <= 0 {
		return "", fmt.Errorf("%w: TLS needs the serial of the keyring holding the PSK", ErrConnection)
	}
	// The kernel splits the string at commas and lines: an NQN holding
	// one would smuggle in an option of its own.
	for _, v := range []struct{ field, v string }{{"host_nqn", c.HostNQN}, {"subsystem_nqn", c.SubsystemNQN}} {
		if strings.ContainsAny(v.v, ",\n") {
			return "", fmt.Errorf("%w: %s must not contain a comma or a line break", ErrConnection, v.field)
		}
	}
	p := c.Ports[i]
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		if v != "" {
			b.WriteByte('=')
			b.WriteString(v)
		}
	}
	add("nqn", c.SubsystemNQN)
	add("transport", p.Transport)
	add("traddr", p.Address)
	add("trsvcid", p.ServiceID)
	add("hostnqn", c.HostNQN)
	// The kernel refuses a second host NQN under its default host ID.
	add("hostid", c.hostID())
	if c.DHCHAPKey != "" {
		add("dhchap_secret", c.DHCHAPKey)
	}
	if c.DHCHAPCtrlKey != "" {
		add("dhchap_ctrl_secret", c.DHCHAPCtrlKey)
	}
	if c.TLS {
		add("tls", "")
		add("keyring", strconv.Itoa(keyring))
	}
	if duplicate {
		add("duplicate_connect", "")
	}
	return b.String(), nil
}
