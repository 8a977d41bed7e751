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
