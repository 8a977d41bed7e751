package nvmegate

import (
	"fmt"
	"regexp"
	"strconv"
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
// that keeps messages readable and with unprintable and default-ignorable
// characters escaped (Quote).
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
		return Quote(v[:cut]) + "…"
	}
	return Quote(v)
}

// unsafeRune returns the first character of s that no caller-supplied string
// may hold, and its byte offset; -1 if there is none. Those are invalid UTF-8
// (returned as utf8.RuneError), the Unicode categories
//
//   - Cc, control: C0 and C1 controls, DEL, NEL (U+0085);
//   - Cf, format: bidirectional overrides and isolates (U+202A-U+202E,
//     U+2066-U+2069), zero-width space and joiners (U+200B-U+200D), the
//     byte order mark (U+FEFF), soft hyphen (U+00AD);
//   - Zl and Zp, line and paragraph separators (U+2028, U+2029),
//
// and the property Default_Ignorable_Code_Point (defaultIgnorable: besides
// most of Cf, the Hangul fillers, the combining grapheme joiner and the
// variation selectors), which are invisible or move the text around them:
// in a CLI table or a log line they would let one value pose as another or
// hide what follows it.
//
// The variation selectors include U+FE0F, which asks for the emoji
// presentation of the character before it: an emoji typed or pasted with
// it ("✔️" is U+2714 U+FE0F) is refused, the same emoji without it ("✔",
// "🚀") is not. Emoji joined by U+200D (a ZWJ sequence) were refused
// already, as Cf.
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
		if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp, defaultIgnorable) {
			return r, i
		}
		i += n
	}
	return 0, -1
}

// defaultIgnorable is the Unicode property Default_Ignorable_Code_Point:
// characters that render as nothing unless a font or a terminal chooses to
// show them. It is copied from DerivedCoreProperties.txt of Unicode 15.0.0
// (the edition of Go's unicode tables; the property has the same ranges
// from Unicode 14.0 through 16.0), which derives it as
//
//	Other_Default_Ignorable_Code_Point + Cf + Variation_Selector
//	- White_Space - FFF9..FFFB (interlinear annotation)
//	- 13430..1343F (Egyptian hieroglyph format controls)
//	- Prepended_Concatenation_Mark
//
// Go's unicode package has every term but not the result;
// TestDefaultIgnorableTable checks this table against that derivation for
// every code point. Most of it is Cf, which unsafeRune refuses anyway;
// what it adds are the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0,
// letters that show as blanks), the combining grapheme joiner (U+034F),
// the Khmer inherent vowels (U+17B4, U+17B5), the variation selectors
// (U+180B-U+180D, U+180F, U+FE00-U+FE0F, U+E0100-U+E01EF) and code points
// reserved as default-ignorable (U+2065, U+FFF0-U+FFF8, U+E0000-U+E0FFF).
var defaultIgnorable = &unicode.RangeTable{
	R16: []unicode.Range16{
		{Lo: 0x00ad, Hi: 0x00ad, Stride: 1}, // soft hyphen
		{Lo: 0x034f, Hi: 0x034f, Stride: 1}, // combining grapheme joiner
		{Lo: 0x061c, Hi: 0x061c, Stride: 1}, // Arabic letter mark
		{Lo: 0x115f, Hi: 0x1160, Stride: 1}, // Hangul choseong and jungseong fillers
		{Lo: 0x17b4, Hi: 0x17b5, Stride: 1}, // Khmer vowel inherent AQ, AA
		{Lo: 0x180b, Hi: 0x180f, Stride: 1}, // Mongolian free variation selectors, vowel separator
		{Lo: 0x200b, Hi: 0x200f, Stride: 1}, // zero-width space, joiners, LRM, RLM
		{Lo: 0x202a, Hi: 0x202e, Stride: 1}, // bidirectional embeddings and overrides
		{Lo: 0x2060, Hi: 0x206f, Stride: 1}, // word joiner, invisible operators, isolates, U+2065, deprecated formats
		{Lo: 0x3164, Hi: 0x3164, Stride: 1}, // Hangul filler
		{Lo: 0xfe00, Hi: 0xfe0f, Stride: 1}, // variation selectors 1-16
		{Lo: 0xfeff, Hi: 0xfeff, Stride: 1}, // zero-width no-break space (BOM)
		{Lo: 0xffa0, Hi: 0xffa0, Stride: 1}, // halfwidth Hangul filler
		{Lo: 0xfff0, Hi: 0xfff8, Stride: 1}, // reserved
	},
	R32: []unicode.Range32{
		{Lo: 0x1bca0, Hi: 0x1bca3, Stride: 1}, // shorthand format controls
		{Lo: 0x1d173, Hi: 0x1d17a, Stride: 1}, // musical symbol format controls
		{Lo: 0xe0000, Hi: 0xe0fff, Stride: 1}, // tags, variation selectors 17-256, reserved
	},
	LatinOffset: 1,
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
		return Invalid(field, "must not contain control, format, line-separator or invisible (default-ignorable) characters such as newlines, bidirectional overrides, zero-width spaces, fillers or variation selectors (found %U at byte %d)", r, i)
	}
}

// ValidateText checks operator free text (descriptions, audit reasons): at
// most 256 bytes of UTF-8 without key material or control, format,
// separator or default-ignorable characters (ValidateString), and present
// when required.
func ValidateText(field, v string, required bool) error {
	if v == "" && required {
		return Invalid(field, "is required")
	}
	if len(v) > 256 {
		return Invalid(field, "must be at most 256 bytes (got %d)", len(v))
	}
	return ValidateString(field, v)
}

// Quote quotes s as strconv.Quote does, and escapes (\uXXXX, \UXXXXXXXX)
// the default-ignorable characters that strconv.Quote leaves as they are
// because it counts them printable: the Hangul fillers (letters) and the
// variation selectors and combining grapheme joiner (marks). What shows a
// value ValidateString refuses (a CLI table, a log line) shows it with
// Quote, so that whatever hid in it becomes visible; the result is still a
// Go string literal that strconv.Unquote reads back.
func Quote(s string) string {
	q := strconv.Quote(s)
	if !strings.ContainsFunc(q, func(r rune) bool { return unicode.Is(defaultIgnorable, r) }) {
		return q
	}
	var b strings.Builder
	for _, r := range q {
		switch {
		case !unicode.Is(defaultIgnorable, r):
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}
