package nvmefmt

import (
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
)

// HostNQNNamespace is the UUIDv5 namespace under which host NQNs are derived
// from SPIFFE IDs. It is itself UUIDv5(NameSpaceURL,
// "https://nvmegate.dev/ns/host-nqn/v1") and must never change: every node
// without an explicit binding would get a new host NQN, and with it new
// credentials and a new target entry.
var HostNQNNamespace = uuid.MustParse("e0f6bfa2-56aa-5dc0-9b36-c5480428322d")

// HostNQNFromSPIFFEID derives a node's default host NQN from its SPIFFE ID:
// "nqn.2014-08.org.nvmexpress:uuid:" + UUIDv5(HostNQNNamespace, id). SPIFFE
// IDs (up to 2048 bytes) do not fit in an NQN (223 bytes), so the mapping is
// a hash; it is deterministic, so the node, the gateway and the target agree
// without storing anything.
func HostNQNFromSPIFFEID(id string) (string, error) {
	parsed, err := spiffeid.FromString(id)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrSPIFFEID, err)
	}
	if parsed.Path() == "" {
		return "", fmt.Errorf("%w: %q names a trust domain, not a workload", ErrSPIFFEID, id)
	}
	u := uuid.NewSHA1(HostNQNNamespace, []byte(parsed.String()))
	return nvmegate.UUIDNQNPrefix + u.String(), nil
}

// HostID returns the host identifier (hostid) to use with hostNQN: the UUID
// of a UUID-form NQN, so that NQN and ID name the same host as nvme-cli's
// gen-hostnqn arranges; otherwise UUIDv5(HostNQNNamespace, hostNQN), stable
// for that NQN. The kernel refuses one host NQN with two host IDs.
func HostID(hostNQN string) string {
	if u, ok := strings.CutPrefix(hostNQN, nvmegate.UUIDNQNPrefix); ok {
		if parsed, err := uuid.Parse(u); err == nil {
			return parsed.String()
		}
	}
	return uuid.NewSHA1(HostNQNNamespace, []byte(hostNQN)).String()
}
