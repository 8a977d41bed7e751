package nvmegate

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
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
	if err := ValidateString(field, v); err != nil {
		return err
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
	if err := ValidateString(field, v); err != nil {
		return err
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
	if err := ValidateString(field, v); err != nil {
		return err
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
	if err := ValidateString(field, v); err != nil {
		return err
	}
	if !jobIDRE.MatchString(v) {
		return Invalid(field, "must be 1-128 characters of A-Z, a-z, 0-9 and ._:-, starting with a letter or digit (got %s)", show(v))
	}
	return nil
}

// show quotes a caller-supplied value for an error message, cut to a length
// that keeps messages readable and with unprintable characters escaped.
// Only non-secret fields are ever shown; a value that looks like key
// material is not shown at all.
func show(v string) string {
	if LooksLikeKeyMaterial(v) {
		return "(a value that looks like key material, not shown)"
	}
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

// unsafeRune returns the first character of s that no caller-supplied string
// may hold, and its byte offset; -1 if there is none. Those are invalid UTF-8
// (returned as utf8.RuneError) and the Unicode categories
//
//   - Cc, control: C0 and C1 controls, DEL, NEL (U+0085);
//   - Cf, format: bidirectional overrides and isolates (U+202A-U+202E,
//     U+2066-U+2069), zero-width space and joiners (U+200B-U+200D), the
//     byte order mark (U+FEFF), soft hyphen (U+00AD);
//   - Zl and Zp, line and paragraph separators (U+2028, U+2029),
//
// which are invisible or move the text around them: in a CLI table or a log
// line they would let one value pose as another or hide what follows it.
func unsafeRune(s string) (rune, int) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == 0x7f {
				return rune(c), i
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return r, i
		}
		if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) {
			return r, i
		}
		i += n
	}
	return 0, -1
}

// keyMarkers start the secrets the gateway handles, lower-cased:
// DH-HMAC-CHAP secrets ("DHHC-1:hh:<base64>:"), NVMe/TCP TLS PSKs in the
// interchange format ("NVMeTLSkey-1:hh:<base64>:") and PEM private keys
// ("-----BEGIN [RSA |EC |OPENSSH ]PRIVATE KEY-----").
var keyMarkers = []string{"dhhc-1:", "nvmetlskey-1:", "private key-----"}

// LooksLikeKeyMaterial reports whether s contains, in any letter case, the
// start of a secret the gateway handles: a DH-HMAC-CHAP secret, an NVMe TLS
// PSK in the interchange format or a PEM private key. It is the one test of
// key material: every Validate function refuses such strings (so free text
// cannot carry a key into the inventory, a response or a log), error
// messages never show them, and the audit log refuses entries holding one.
// It cannot recognise a bare secret (hex or base64 without its prefix).
func LooksLikeKeyMaterial(s string) bool {
	// Every marker contains "-1:" or "y-----"; look for the rarer
	// character first, without allocating.
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '-' {
			continue
		}
		for _, m := range keyMarkers {
			// Align the marker so that its first '-' is at i.
			st := i - strings.IndexByte(m, '-')
			if st < 0 || st+len(m) > len(s) {
				continue
			}
			if strings.EqualFold(s[st:st+len(m)], m) {
				return true
			}
		}
	}
	return false
}

// ValidateString refuses what no caller-supplied string may hold, whatever its
// field and syntax: key material (LooksLikeKeyMaterial), invalid UTF-8 and
// the characters of unsafeRune. Every Validate function of this package
// calls it first, so that a new field cannot miss it and no later message
// echoes such a value; code that checks a string of its own shape (a policy
// module's file name) calls it too. The message about key material names
// the kinds of key, never the value.
func ValidateString(field, v string) error {
	if LooksLikeKeyMaterial(v) {
		return Invalid(field, "looks like key material (a DH-HMAC-CHAP secret, NVMe TLS PSK or private key), which is never stored; leave the key out")
	}
	r, i := unsafeRune(v)
	switch {
	case i < 0:
		return nil
	case r == utf8.RuneError:
		return Invalid(field, "must be valid UTF-8 (invalid byte at offset %d)", i)
	default:
		return Invalid(field, "must not contain control, format or line-separator characters such as newlines, bidirectional overrides or zero-width spaces (found %U at byte %d)", r, i)
	}
}

// ValidateText checks operator free text (descriptions, audit reasons): at
// most 256 bytes of UTF-8 without key material or control, format or
// separator characters (ValidateString), and present when required.
func ValidateText(field, v string, required bool) error {
	if v == "" && required {
		return Invalid(field, "is required")
	}
	if len(v) > 256 {
		return Invalid(field, "must be at most 256 bytes (got %d)", len(v))
	}
	return ValidateString(field, v)
}
