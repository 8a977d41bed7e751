package nvmegate_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/nvmegate/nvmegate"
)

func TestValidateNQN(t *testing.T) {
	long := "nqn.2014-08.com.example:" + strings.Repeat("x", 223-len("nqn.2014-08.com.example:"))
	for _, tc := range []struct {
		nqn  string
		rule string // "" means valid
	}{
		{"nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6", ""},
		{"nqn.2026-01.io.nvmegate.demo:acme-train", ""},
		{"nqn.2016-06.io.spdk:cnode1", ""},
		{"nqn.psk-test-host", "nqn.yyyy-mm"}, // libnvme test NQNs are not NVMe-spec NQNs
		{long, ""},
		{long + "x", "11-223 bytes"},
		{"nqn.x", "11-223 bytes"},
		{"", "is required"},
		{nvmegate.DiscoveryNQN, "discovery NQN"},
		{"nqn.2014-08.org.nvmexpress:uuid:not-a-uuid-at-all-0000000000000000", "UUID"},
		{"nqn.2014-13.com.example:x", "nqn.yyyy-mm"},
		{"nqn.2014-08.com.example", "nqn.yyyy-mm"},
		{"nqn.2014-08.-bad.example:x", "nqn.yyyy-mm"},
		{"iqn.2014-08.com.example:x", "nqn.yyyy-mm"},
		{"nqn.2014-08.com.example:with space", "spaces"},
		{"nqn.2014-08.com.example:a/b", "'/'"},
		{"nqn.2014-08.com.example:tab\there", "control"},
		{"nqn.2014-08.com.example:\xff\xfe", "UTF-8"},
		{"nqn.2014-08.com.example:next\u0085line", "U+0085"},
		{"nqn.2014-08.com.example:\u202egnp.exe", "U+202E"},
		{"nqn.2014-08.com.example:a\u2028b", "U+2028"},
		{"nqn.2014-08.com.example:zero\u200bwidth", "U+200B"},
		{"\ufeffnqn.2014-08.com.example:bom", "U+FEFF"},
	} {
		err := nvmegate.ValidateNQN("nqn", tc.nqn)
		if tc.rule == "" {
			if err != nil {
				t.Errorf("ValidateNQN(%q) = %v, want nil", tc.nqn, err)
			}
			continue
		}
		var e *nvmegate.Error
		if !errors.As(err, &e) || e.Code != nvmegate.EINVALID || e.Field != "nqn" || !strings.Contains(e.Message, tc.rule) {
			t.Errorf("ValidateNQN(%q) = %v, want EINVALID on nqn mentioning %q", tc.nqn, err, tc.rule)
		}
	}
}

// FuzzValidateNQN: no input panics, every refusal names the field, and an
// accepted NQN has the length and prefix the spec requires.
func FuzzValidateNQN(f *testing.F) {
	for _, s := range []string{"nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6", "nqn.2016-06.io.spdk:cnode1", "", "nqn.", "\x00"} {
		f.Add(s)
	}
	for _, r := range invisible {
		f.Add("nqn.2016-06.io.spdk:cnode" + string(r) + "1")
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := nvmegate.ValidateNQN("f", s)
		if err != nil {
			var e *nvmegate.Error
			if !errors.As(err, &e) || e.Field != "f" || e.Code != nvmegate.EINVALID {
				t.Fatalf("refusal %v does not name the field", err)
			}
			if !utf8.ValidString(err.Error()) {
				t.Fatalf("error message is not UTF-8: %q", err.Error())
			}
			return
		}
		if len(s) < 11 || len(s) > 223 || !strings.HasPrefix(s, "nqn.") || !utf8.ValidString(s) {
			t.Fatalf("accepted %q", s)
		}
		for _, r := range s {
			if unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) {
				t.Fatalf("accepted %q with %U", s, r)
			}
		}
	})
}

// A UUID NQN names its UUID's host whatever the letter case: its
// canonical form is lower case. Other NQNs are compared as they are.
func TestCanonicalNQN(t *testing.T) {
	const lower = "nqn.2014-08.org.nvmexpress:uuid:00000001-bbbb-4000-8000-00000000000a"
	for in, want := range map[string]string{
		lower: lower,
		"nqn.2014-08.org.nvmexpress:uuid:00000001-BBBB-4000-8000-00000000000A":           lower,
		"nqn.2014-08.org.nvmexpress:uuid:00000001-bBbB-4000-8000-00000000000a":           lower,
		"nqn.2014-08.ORG.NVMEXPRESS:UUID:00000001-BBBB-4000-8000-00000000000A":           lower, // a date-domain NQN by syntax
		"nqn.2014-08.org.nvmexpress:uuid:NOT-A-UUID":                                     "nqn.2014-08.org.nvmexpress:uuid:NOT-A-UUID",
		"nqn.2026-01.io.Example:Host-1":                                                  "nqn.2026-01.io.Example:Host-1",
		"nqn.2014-08.org.nvmexpre\u017f\u017f:uuid:00000001-bbbb-4000-8000-00000000000a": "nqn.2014-08.org.nvmexpre\u017f\u017f:uuid:00000001-bbbb-4000-8000-00000000000a",
		"": "",
	} {
		if got := nvmegate.CanonicalNQN(in); got != want {
			t.Errorf("CanonicalNQN(%q) = %q, want %q", in, got, want)
		}
		if got := nvmegate.CanonicalNQN(want); got != want {
			t.Errorf("CanonicalNQN is not idempotent on %q: %q", want, got)
		}
	}
	if n := testing.AllocsPerRun(100, func() { nvmegate.CanonicalNQN(lower) }); n != 0 {
		t.Errorf("CanonicalNQN of a canonical NQN allocates %v times", n)
	}
}

// A host binding's NQN must be canonical: upper case in a UUID NQN is
// refused, naming the form to write, not folded.
func TestValidateHostNQN(t *testing.T) {
	const upper = "nqn.2014-08.org.nvmexpress:uuid:00000001-BBBB-4000-8000-00000000000A"
	if err := nvmegate.ValidateNQN("host_nqn", upper); err != nil {
		t.Fatalf("ValidateNQN(%q) = %v: the syntax is fine", upper, err)
	}
	for nqn, rule := range map[string]string{
		upper: "lower case",
		"nqn.2014-08.ORG.nvmexpress:uuid:00000001-bbbb-4000-8000-00000000000a": "lower case",
		"nqn.2014-08.org.nvmexpress:uuid:00000001-bbbb-4000-8000-00000000000a": "",
		"nqn.2026-01.io.Example:Host-1":                                        "",
		"nqn.2014-08.org.nvmexpress:uuid:not-a-uuid":                           "UUID",
	} {
		err := nvmegate.ValidateHostNQN("host_nqn", nqn)
		if rule == "" {
			if err != nil {
				t.Errorf("ValidateHostNQN(%q) = %v", nqn, err)
			}
			continue
		}
		var e *nvmegate.Error
		if !errors.As(err, &e) || e.Code != nvmegate.EINVALID || e.Field != "host_nqn" || !strings.Contains(e.Message, rule) {
			t.Errorf("ValidateHostNQN(%q) = %v, want EINVALID on host_nqn mentioning %q", nqn, err, rule)
		}
	}
	b := nvmegate.HostBinding{SPIFFEID: "spiffe://example.org/node/a", HostNQN: upper}
	var e *nvmegate.Error
	if err := b.Validate(); !errors.As(err, &e) || e.Field != "host_nqn" || !strings.Contains(e.Message, nvmegate.CanonicalNQN(upper)) {
		t.Errorf("HostBinding.Validate with %q = %v, want a refusal naming the canonical form", upper, err)
	}
}
