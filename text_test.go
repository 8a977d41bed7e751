package nvmegate_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nvmegate/nvmegate"
)

// invisible are characters of the categories no caller-supplied string may
// hold (Cc, Cf, Zl, Zp): each hides itself or reorders or breaks the text
// around it in a terminal, a CLI table or a log line.
var invisible = []rune{
	0x00,    // NUL
	0x1b,    // ESC, starts terminal escape sequences
	0x7f,    // DEL
	0x85,    // NEL, a line break to some terminals and log viewers
	0x9b,    // CSI (C1)
	0xad,    // soft hyphen
	0x061c,  // Arabic letter mark
	0x200b,  // zero-width space
	0x200d,  // zero-width joiner
	0x200e,  // left-to-right mark
	0x202e,  // right-to-left override
	0x2066,  // left-to-right isolate
	0x2028,  // line separator
	0x2029,  // paragraph separator
	0x2060,  // word joiner
	0xfeff,  // byte order mark / zero-width no-break space
	0xe0041, // tag latin capital letter A
	// Default_Ignorable_Code_Point outside Cf (issue 29): letters and
	// marks that render as nothing.
	0x034f,  // combining grapheme joiner
	0x115f,  // Hangul choseong filler
	0x1160,  // Hangul jungseong filler
	0x17b4,  // Khmer vowel inherent AQ
	0x180b,  // Mongolian free variation selector one
	0x2065,  // reserved, default-ignorable
	0x3164,  // Hangul filler
	0xfe0f,  // variation selector-16 (emoji presentation)
	0xffa0,  // halfwidth Hangul filler
	0xe0100, // variation selector-17
}

// validators are every Validate function of caller-supplied strings, each
// with a valid value and the byte offset where a character is inserted.
var validators = []struct {
	name  string
	check func(field, v string) error
	valid string
	at    int
}{
	{"ValidateText", func(f, v string) error { return nvmegate.ValidateText(f, v, true) }, "rebuilt after disk swap", 7},
	{"ValidateNQN", nvmegate.ValidateNQN, "nqn.2026-01.io.example:acme-train", 25},
	{"ValidateLabel", nvmegate.ValidateLabel, "eu-west", 2},
	{"ValidateTenant", nvmegate.ValidateTenant, "acme", 2},
	{"ValidateDatasetName", nvmegate.ValidateDatasetName, "common-crawl/2026-10", 6},
	{"ValidateDigest", nvmegate.ValidateDigest, "sha256:" + strings.Repeat("ab", 32), 9},
	{"ValidateJobID", nvmegate.ValidateJobID, "slurm:1234", 6},
	{"ValidateGrantID", nvmegate.ValidateGrantID, "g_0123456789abcdef", 4},
	{"ValidateSPIFFEID", nvmegate.ValidateSPIFFEID, "spiffe://example.org/node/gpu-1", 26},
}

// Every validator refuses every invisible character, wherever it is, with
// InvalidArgument on the field; the message names the code point and
// never echoes the character itself.
func TestValidatorsRefuseInvisibleCharacters(t *testing.T) {
	for _, v := range validators {
		if err := v.check("f", v.valid); err != nil {
			t.Fatalf("%s(%q) = %v, want nil", v.name, v.valid, err)
		}
		for _, r := range invisible {
			for _, s := range []string{
				v.valid[:v.at] + string(r) + v.valid[v.at:],
				v.valid + string(r),
			} {
				err := v.check("f", s)
				var e *nvmegate.Error
				if !errors.As(err, &e) || e.Code != nvmegate.EINVALID || e.Field != "f" {
					t.Errorf("%s(%q) = %v, want EINVALID on f", v.name, s, err)
					continue
				}
				if strings.ContainsRune(err.Error(), r) {
					t.Errorf("%s(%q): message echoes %U: %q", v.name, s, r, err)
				}
				if want := fmt.Sprintf("%U", r); !strings.Contains(err.Error(), want) {
					t.Errorf("%s(%q) = %q, want the message to name %s", v.name, s, err, want)
				}
			}
		}
		if err := v.check("f", v.valid[:v.at]+"\xff"+v.valid[v.at:]); err == nil || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("%s: invalid UTF-8: %v", v.name, err)
		}
	}
}

// Printable non-ASCII text is free text, not a spoof: descriptions and the
// user part of NQNs may hold it, in any script, with its combining marks,
// and emoji without a variation selector.
func TestValidatorsAcceptPrintableUnicode(t *testing.T) {
	for _, s := range []string{"Größe – 東京 ✓", "café ×2 (β)", "naïve\u00a0text", "𝒳 \U0001F680",
		// Hangul syllables (not the fillers); Cyrillic; Hebrew and Arabic,
		// right to left by themselves
		"디스크 교체 후 재구축", "замена диска", "החלפת דיסק", "استبدال القرص",
		// Devanagari, katakana, Telugu and Khmer, with their marks
		"डिस्क बदली", "ディスク交換", "ఢిల్లీ", "ស្ថានីយ",
		// a combining accent; emoji, one with a skin-tone modifier
		"cafe\u0301", "✔ done 🚀🔥", "👍🏽",
	} {
		if err := nvmegate.ValidateText("description", s, true); err != nil {
			t.Errorf("ValidateText(%q) = %v", s, err)
		}
	}
	if err := nvmegate.ValidateNQN("nqn", "nqn.2026-01.io.example:größe-東京"); err != nil {
		t.Errorf("ValidateNQN: %v", err)
	}
}

// Default_Ignorable_Code_Point is refused in every caller string (issue
// 29), with the code point named: the characters of the issue and the
// emoji presentation selector after an emoji. "✔️" (U+2714 U+FE0F) is
// refused although "✔" is accepted: the selector renders as nothing, so a
// value holding it cannot be told from one without it.
func TestDefaultIgnorableRefused(t *testing.T) {
	for _, c := range []struct {
		s    string
		want string
	}{
		{"rebuilt\u3164after swap", "U+3164"},
		{"\u115fadmin", "U+115F"},
		{"a\u1160b", "U+1160"},
		{"ops\uffa0", "U+FFA0"},
		{"done \u2714\ufe0f", "U+FE0F"},
		{"\u1820\u180b", "U+180B"},
		{"o\u034fk", "U+034F"},
	} {
		for _, check := range []func() error{
			func() error { return nvmegate.ValidateText("reason", c.s, true) },
			func() error { return nvmegate.ValidateNQN("nqn", "nqn.2026-01.io.example:"+c.s) },
		} {
			err := check()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "default-ignorable") {
				t.Errorf("%q: %v, want a refusal naming %s", c.s, err, c.want)
			}
		}
	}
}

// isDefaultIgnorable is Default_Ignorable_Code_Point as
// DerivedCoreProperties.txt derives it, from the tables of Go's unicode
// package: independent of the validator's own table.
func isDefaultIgnorable(r rune) bool {
	if !unicode.In(r, unicode.Other_Default_Ignorable_Code_Point, unicode.Cf, unicode.Variation_Selector) {
		return false
	}
	return !unicode.In(r, unicode.White_Space, unicode.Prepended_Concatenation_Mark) &&
		!(0xfff9 <= r && r <= 0xfffb) && !(0x13430 <= r && r <= 0x1343f)
}

// refused says whether ValidateString must refuse r: Cc, Cf, Zl, Zp and
// Default_Ignorable_Code_Point.
func refused(r rune) bool {
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) || isDefaultIgnorable(r)
}

// Every code point, one at a time: ValidateString refuses exactly Cc, Cf,
// Zl, Zp and Default_Ignorable_Code_Point as derived from its definition
// (so its table matches DerivedCoreProperties.txt, and keeps matching when
// Go's Unicode edition changes), and naming it.
func TestDefaultIgnorableTable(t *testing.T) {
	if unicode.Version != "15.0.0" {
		t.Logf("Go's unicode tables are of Unicode %s; the validator's Default_Ignorable_Code_Point table is of 15.0.0", unicode.Version)
	}
	bad := 0
	for r := rune(0); r <= unicode.MaxRune && bad < 10; r++ {
		if 0xd800 <= r && r <= 0xdfff {
			continue // surrogates: not encodable in UTF-8
		}
		err := nvmegate.ValidateString("f", string(r))
		if want := refused(r); (err != nil) != want {
			t.Errorf("ValidateString(%U) = %v, want refused=%v", r, err, want)
			bad++
		} else if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("%U", r)) {
			t.Errorf("ValidateString(%U) = %q, want the code point named", r, err)
			bad++
		}
	}
}

// Quote escapes every character a value may not hold, including the
// default-ignorable letters and marks strconv.Quote would leave as they
// are, and reads back with strconv.Unquote.
func TestQuote(t *testing.T) {
	for _, r := range invisible {
		s := "a" + string(r) + "b"
		q := nvmegate.Quote(s)
		if strings.ContainsRune(q, r) {
			t.Errorf("Quote(%U) = %q holds it", r, q)
		}
		if u, err := strconv.Unquote(q); err != nil || u != s {
			t.Errorf("Unquote(Quote(%U)) = %q, %v", r, u, err)
		}
	}
	if q := nvmegate.Quote("Größe 東京 🚀"); q != `"Größe 東京 🚀"` {
		t.Errorf("Quote kept no printable text as it is: %s", q)
	}
}

// FuzzValidateText: no input panics, a refusal names the field, and an
// accepted text is at most 256 bytes of valid UTF-8 without key material
// or a character of the refused categories or Default_Ignorable_Code_Point
// (checked here independently of the validator).
func FuzzValidateText(f *testing.F) {
	for _, s := range []string{"", "ok", "a\nb", "\xff", strings.Repeat("x", 257), "é"} {
		f.Add(s)
	}
	for _, r := range invisible {
		f.Add("abc" + string(r) + "def")
	}
	for _, k := range keys {
		f.Add("see " + k.key)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := nvmegate.ValidateText("f", s, false)
		if err != nil {
			var e *nvmegate.Error
			if !errors.As(err, &e) || e.Field != "f" || e.Code != nvmegate.EINVALID {
				t.Fatalf("refusal %v does not name the field", err)
			}
			return
		}
		l := asciiLower(s)
		if len(s) > 256 || !utf8.ValidString(s) ||
			strings.Contains(l, "dhhc-1:") || strings.Contains(l, "nvmetlskey-1:") || strings.Contains(l, "private key-----") {
			t.Fatalf("accepted %q", s)
		}
		for _, r := range s {
			if refused(r) {
				t.Fatalf("accepted %q with %U", s, r)
			}
		}
	})
}

// Keys in the forms the gateway hands out, each one that the syntax of a
// job ID or an NQN's user part would otherwise accept.
var keys = []struct{ name, key, body string }{
	{"DH-HMAC-CHAP secret", "DHHC-1:00:" + keyBody + ":", keyBody},
	{"DH-HMAC-CHAP secret, lower case", "dhhc-1:01:" + keyBody + ":", keyBody},
	{"NVMe TLS PSK", "NVMeTLSkey-1:01:" + keyBody + ":", keyBody},
	{"NVMe TLS PSK, upper case", "NVMETLSKEY-1:02:" + keyBody + ":", keyBody},
	{"PEM private key", "-----BEGIN PRIVATE KEY-----MC4CAQAwBQYDK2VwBCIEI" + keyBody[:20], keyBody[:20]},
	{"PEM EC private key", "-----BEGIN EC PRIVATE KEY-----", "EC PRIVATE KEY"},
}

// keyBody is base64 of a 32-byte secret and its CRC, picked without '+',
// '/' or '=' so that it is also a valid job ID and NQN tail.
const keyBody = "QWxsIHRoYXQgZ2xpdHRlcnMgaXMgbm90IGdvbGQuLi4uLkAx"

// Every validator refuses a value holding key material, wherever it is,
// with InvalidArgument on the field and a message that says why without
// repeating the key.
func TestValidatorsRefuseKeyMaterial(t *testing.T) {
	for _, v := range validators {
		for _, k := range keys {
			for _, s := range []string{
				k.key,
				v.valid[:v.at] + k.key + v.valid[v.at:],
				v.valid + k.key,
			} {
				err := v.check("f", s)
				var e *nvmegate.Error
				if !errors.As(err, &e) || e.Code != nvmegate.EINVALID || e.Field != "f" {
					t.Errorf("%s(%s in %q) = %v, want EINVALID on f", v.name, k.name, s, err)
					continue
				}
				if !strings.Contains(err.Error(), "key material") {
					t.Errorf("%s(%s) = %q, want it to say key material", v.name, k.name, err)
				}
				if strings.Contains(err.Error(), k.body) || strings.Contains(strings.ToLower(err.Error()), "dhhc-1:") ||
					strings.Contains(strings.ToLower(err.Error()), "nvmetlskey-1:") {
					t.Errorf("%s(%s): message repeats the key: %q", v.name, k.name, err)
				}
			}
		}
	}
	// The same words without the markers are fine in free text.
	for _, s := range []string{"rotated the DHHC key of acme", "PSK leaked via NVMeTLSkey file", "private key lost", "DHHC-1 secret"} {
		if err := nvmegate.ValidateText("reason", s, true); err != nil {
			t.Errorf("ValidateText(%q) = %v", s, err)
		}
	}
}

// A subsystem's description is free text kept in the inventory and
// returned by GetSubsystem: a key in it is refused before it is stored.
func TestSubsystemDescriptionKeyMaterial(t *testing.T) {
	for _, k := range keys {
		s := nvmegate.Subsystem{NQN: "nqn.2026-01.io.example:s", TargetID: "stor-1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true,
			Description: "host secret is " + k.key}
		err := s.Validate()
		if field(err) != "description" || !strings.Contains(err.Error(), "key material") || strings.Contains(err.Error(), k.body) {
			t.Errorf("%s: %v", k.name, err)
		}
	}
}

// LooksLikeKeyMaterial finds every marker in any letter case and at any
// position, and nothing in text without one.
func TestLooksLikeKeyMaterial(t *testing.T) {
	for _, k := range keys {
		for _, s := range []string{k.key, "x" + k.key, "\u00e9" + k.key + "\u00e9"} {
			if !nvmegate.LooksLikeKeyMaterial(s) {
				t.Errorf("LooksLikeKeyMaterial(%q) = false", s)
			}
		}
	}
	for _, s := range []string{"", "-", "DHHC-1", "DHHC-2:00:x:", "NVMeTLSkey-2:", "PRIVATE KEY----", "public key-----", "-1:-1:y-----"} {
		if nvmegate.LooksLikeKeyMaterial(s) {
			t.Errorf("LooksLikeKeyMaterial(%q) = true", s)
		}
	}
}

// asciiLower lower-cases A-Z only: Unicode case mapping would turn other
// characters (the Kelvin sign) into ASCII letters that no key starts with.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// FuzzLooksLikeKeyMaterial checks the allocation-free search against the
// obvious one.
func FuzzLooksLikeKeyMaterial(f *testing.F) {
	for _, k := range keys {
		f.Add(k.key)
	}
	f.Add("dHhC-1:")
	f.Add("-----BEGIN RSA PRIVATE KEY-----")
	f.Fuzz(func(t *testing.T, s string) {
		l := asciiLower(s)
		want := strings.Contains(l, "dhhc-1:") || strings.Contains(l, "nvmetlskey-1:") || strings.Contains(l, "private key-----")
		if got := nvmegate.LooksLikeKeyMaterial(s); got != want {
			t.Fatalf("LooksLikeKeyMaterial(%q) = %v, want %v", s, got, want)
		}
	})
}

// Fields checked against a fixed set of values (a driver, a transport, an
// address) do not run the key check, but their messages show the value:
// a key there is refused like any other wrong value and never shown.
func TestMessagesNeverShowKeyMaterial(t *testing.T) {
	key := "DHHC-1:00:" + keyBody + ":"
	for name, mut := range map[string]func(*nvmegate.Target){
		"driver":         func(x *nvmegate.Target) { x.Driver = key },
		"transport":      func(x *nvmegate.Target) { x.Ports[0].Transport = key },
		"address":        func(x *nvmegate.Target) { x.Ports[0].Address = key },
		"address_family": func(x *nvmegate.Target) { x.Ports[0].AddressFamily = key },
		"service_id":     func(x *nvmegate.Target) { x.Ports[0].ServiceID = key },
		"secure_channel": func(x *nvmegate.Target) { x.Ports[0].SecureChannel = key },
	} {
		tg := validTarget()
		mut(&tg)
		err := tg.Validate()
		if err == nil || strings.Contains(err.Error(), keyBody) || !strings.Contains(err.Error(), "key material") {
			t.Errorf("%s: %v", name, err)
		}
	}
	j := nvmegate.Job{ID: "j", Tenant: "acme", Nodes: []string{"spiffe://example.org/node/a"},
		Namespaces: []nvmegate.JobNamespace{{SubsystemNQN: "nqn.2026-01.io.example:s", NSID: 1, Mode: key}}}
	if err := j.Validate(time.Now()); err == nil || strings.Contains(err.Error(), keyBody) {
		t.Errorf("job mode: %v", err)
	}
}
