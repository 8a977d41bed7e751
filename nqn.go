package nvmegate

import (
	"regexp"
	"strings"
)

// NVMe Qualified Names (NVMe Base Specification 2.0, §4.5): 11 to 223 bytes of
// UTF-8, either "nqn.yyyy-mm.<reverse domain>:<string>" (the domain owner's
// naming authority) or "nqn.2014-08.org.nvmexpress:uuid:<uuid>".
const (
	// DiscoveryNQN is the well-known NQN of a discovery controller.
	DiscoveryNQN = "nqn.2014-08.org.nvmexpress.discovery"
	// UUIDNQNPrefix starts an NQN made from a UUID (host NQNs mostly).
	UUIDNQNPrefix = "nqn.2014-08.org.nvmexpress:uuid:"

	minNQNLen = 11
	maxNQNLen = 223
)

var (
	// nqn.yyyy-mm.<reverse domain> followed by ':' and a user part. The
	// domain is dot-separated labels; the year-month is the month the naming
	// authority owned the domain.
	nqnDateDomainRE = regexp.MustCompile(`^nqn\.(19|20)[0-9]{2}-(0[1-9]|1[0-2])\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*:.+$`)
	uuidRE          = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
)

// ValidateNQN checks the syntax of an NQN of an NVM subsystem or a host. The
// discovery NQN is refused: it names no subsystem or host of ours.
func ValidateNQN(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if len(v) < minNQNLen || len(v) > maxNQNLen {
		return Invalid(field, "must be %d-%d bytes long, got %d bytes", minNQNLen, maxNQNLen, len(v))
	}
	if err := ValidateString(field, v); err != nil {
		return err
	}
	if strings.ContainsAny(v, " /") {
		// Spaces separate fields of TLS PSK identities and '/' would break
		// configfs paths; neither belongs in an NQN we hand out.
		return Invalid(field, "must not contain spaces or '/' (got %s)", show(v))
	}
	if v == DiscoveryNQN {
		return Invalid(field, "is the discovery NQN, which names no subsystem or host")
	}
	if u, ok := strings.CutPrefix(v, UUIDNQNPrefix); ok {
		if !uuidRE.MatchString(u) {
			return Invalid(field, "must end in a 36-character UUID after %q (got %s)", UUIDNQNPrefix, show(v))
		}
		return nil
	}
	if !nqnDateDomainRE.MatchString(v) {
		return Invalid(field, "must be nqn.yyyy-mm.<reverse domain>:<name> or %s<uuid> (got %s)", UUIDNQNPrefix, show(v))
	}
	return nil
}
