package nvmegate

import (
	"regexp"
	"strings"
)

// NVMe Qualified Names (NVMe Base Specification 2.0, §4.5): 11 to 223 bytes of
// UTF-8, either "nqn.yyyy-mm.<reverse domain>:<string>" (the domain owner's
// naming authority) or "nqn.2014-08.org.nvmexpress:uuid:<uuid>".
//
// # Canonical form
//
// Hosts and targets compare NQNs byte for byte (§4.5), and so does nvmegate,
// with one exception: an NQN in UUID form names the host or subsystem its
// UUID identifies, and a UUID's text is case-insensitive (RFC 9562; the host
// ID nvmegate hands a host is that UUID, see keys/nvmefmt.HostID). So
// "…:uuid:00000001-BBBB-…" and "…:uuid:00000001-bbbb-…" are one host, and a
// host NQN bound to one identity must not be bindable to another in a
// different letter case. CanonicalNQN is the form every such comparison
// uses: the UUID form (the prefix too, in any case) in lower case, any other
// NQN as it is.
//
// The choice: a host binding must be written in canonical form
// (ValidateHostNQN refuses upper case rather than fold it), so that the NQN
// stored, programmed into targets and handed to the node is exactly the one
// the operator typed and configured on the node: a silently folded NQN would
// no longer match an upper-case /etc/nvme/hostnqn, and the target, comparing
// bytes, would refuse the node. Bindings stored by older versions may hold
// upper case; the store indexes host NQNs by their canonical form (and
// re-keys an older file's index on open), so every lookup and every
// uniqueness check is canonical whatever is stored. Subsystem NQNs are names
// of records and are compared as they are.
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

// CanonicalNQN returns the form in which NQNs are compared and indexed: an
// NQN in UUID form (UUIDNQNPrefix, in any letter case, then a UUID) in lower
// case, any other string unchanged. It never fails: an invalid NQN is
// returned as it is, for ValidateNQN to refuse.
func CanonicalNQN(v string) string {
	n := len(UUIDNQNPrefix)
	if len(v) <= n || asciiLower(v[:n]) != UUIDNQNPrefix || !uuidRE.MatchString(v[n:]) {
		return v
	}
	return asciiLower(v) // the UUID form is ASCII, its prefix lower case
}

// asciiLower maps A-Z to a-z and nothing else, allocating only if s has
// upper case. Unicode folding has no place here: strings.EqualFold would
// match 'ſ' to 's', and so make a non-UUID string canonically a UUID NQN.
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// ValidateHostNQN checks a host NQN that an identity is bound to:
// ValidateNQN's syntax, in canonical form (CanonicalNQN), so that one host
// cannot be bound to two identities in two letter cases.
func ValidateHostNQN(field, v string) error {
	if err := ValidateNQN(field, v); err != nil {
		return err
	}
	if c := CanonicalNQN(v); c != v {
		return Invalid(field, "must be written in lower case, as %q: a UUID NQN names its UUID's host whatever the case", c)
	}
	return nil
}

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
