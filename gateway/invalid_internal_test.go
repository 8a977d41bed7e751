package gateway

import (
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate"
)

// invalidDetail keeps a validation error's field and rule and withholds
// every value: quoted ones (escapes inside included, and show's "…" after
// a cut one), and all that follows a quote that opens no Go literal.
func TestInvalidDetailWithholdsValues(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nvmegate.ValidateJobID("job_id", "DHHC-1:00:YWJj/ZGVm+:"),
			`job_id: looks like key material (a DH-HMAC-CHAP secret, NVMe TLS PSK or private key), which is never stored; leave the key out`},
		{nvmegate.ValidateJobID("job_id", "job with spaces"),
			`job_id: must be 1-128 characters of A-Z, a-z, 0-9 and ._:-, starting with a letter or digit (got "…")`},
		{nvmegate.ValidateLabel("id", strings.Repeat("k", 100)),
			`id: must be 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-' (got "…")`},
		{nvmegate.Invalid("candidate_modules", "names must end in .rego (got %q)", "a\"b\\c\x00.rego"),
			`candidate_modules: names must end in .rego (got "…")`},
		{nvmegate.Invalid("x", "%q and %q", "one", "two"), `x: "…" and "…"`},
		{nvmegate.Invalid("x", `unbalanced "secret and more`), `x: unbalanced "…"`},
		{nvmegate.Invalid("page_size", "must be 0-%d (got %d)", 1000, 5000), `page_size: must be 0-1000 (got 5000)`},
		{nvmegate.Invalid("", "is required"), `is required`},
	} {
		if got := invalidDetail(tc.err); got != tc.want {
			t.Errorf("invalidDetail(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
