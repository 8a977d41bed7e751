package nvmegate

import "github.com/spiffe/go-spiffe/v2/spiffeid"

// A tenant is named by a DNS label ("acme"). Tenants are not records of their
// own: a tenant exists by owning subsystems and namespaces, by having
// schedulers whose SPIFFE IDs name it, and by binding nodes.

// ValidateTenant checks a tenant name.
func ValidateTenant(field, v string) error { return ValidateLabel(field, v) }

// maxSPIFFEIDLen is the SPIFFE ID length limit of the SPIFFE-ID spec (§2.3).
const maxSPIFFEIDLen = 2048

// ValidateSPIFFEID checks that v is a SPIFFE ID (spiffe://<trust domain>/<path>)
// naming a workload, not just a trust domain.
func ValidateSPIFFEID(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if len(v) > maxSPIFFEIDLen {
		return Invalid(field, "must be at most %d bytes, as the SPIFFE ID spec allows (got %d)", maxSPIFFEIDLen, len(v))
	}
	if err := ValidateString(field, v); err != nil {
		return err
	}
	id, err := spiffeid.FromString(v)
	if err != nil {
		return Invalid(field, "must be a SPIFFE ID spiffe://<trust domain>/<path>: %v (got %s)", err, show(v))
	}
	if id.Path() == "" {
		return Invalid(field, "must name a workload, not only the trust domain %s", show(v))
	}
	return nil
}
