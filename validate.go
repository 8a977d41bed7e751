package nvmegate

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Naming rules shared by the records. Tenants, regions, fabrics, racks, data
// classes and target IDs are DNS labels so they can appear unescaped in SPIFFE
// ID paths, Rego data keys, file names and metric labels.
var (
	labelRE   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	datasetRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$`)
	digestRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	jobIDRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)
)

// ValidateLabel checks a DNS-label style name (tenant, region, fabric, rack,
// data class, target ID): 1-63 characters of a-z, 0-9 and '-', not starting
// or ending with '-'.
func ValidateLabel(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !labelRE.MatchString(v) {
		return Invalid(field, "must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-' (got %s)", show(v))
	}
	return nil
}

// ValidateDatasetName checks a dataset name: 1-255 characters of letters,
// digits and ._/- starting with a letter or digit.
func ValidateDatasetName(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !datasetRE.MatchString(v) {
		return Invalid(field, "must be 1-255 characters of A-Z, a-z, 0-9 and ._/-, starting with a letter or digit (got %s)", show(v))
	}
	return nil
}

// ValidateDigest checks a content digest of the form sha256:<64 lowercase hex>.
func ValidateDigest(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !digestRE.MatchString(v) {
		return Invalid(field, "must be sha256:<64 lowercase hex digits> (got %s)", show(v))
	}
	return nil
}

// ValidateJobID checks a training job ID as schedulers (Slurm, Kubernetes,
// Ray) spell them: 1-128 characters of letters, digits and ._:-.
func ValidateJobID(field, v string) error {
	if v == "" {
		return Invalid(field, "is required")
	}
	if !jobIDRE.MatchString(v) {
		return Invalid(field, "must be 1-128 characters of A-Z, a-z, 0-9 and ._:-, starting with a letter or digit (got %s)", show(v))
	}
	return nil
}

// show quotes a caller-supplied value for an error message, cut to a length
// that keeps messages readable. Only non-secret fields are ever shown.
func show(v string) string {
	const max = 64
	if len(v) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		return fmt.Sprintf("%q…", v[:cut])
	}
	return fmt.Sprintf("%q", v)
}

// hasControl reports whether s holds ASCII control characters or invalid
// UTF-8, which no identifier of ours may contain.
func hasControl(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	return strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0
}

// ValidateText checks operator free text (descriptions, audit reasons): at
// most 256 bytes of UTF-8 without control characters, and present when
// required.
func ValidateText(field, v string, required bool) error {
	if v == "" && required {
		return Invalid(field, "is required")
	}
	if len(v) > 256 || hasControl(v) {
		return Invalid(field, "must be at most 256 bytes of UTF-8 without control characters")
	}
	return nil
}
