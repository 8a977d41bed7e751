package compliance_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/compliance"
)

// A verified attestation is refused when it was made longer ago than the
// maximum age, before the not-before bound, or too far in the future to
// judge its age; each refusal says when it was made, how long ago and the
// bound. Within the bounds, or without any, it passes (issue 29: a
// replayed bundle used to verify "OK" whatever its age).
func TestFreshness(t *testing.T) {
	p := predicate() // made 2026-12-03T12:00:00Z
	raw, pub, _ := record(t, p)
	rep, err := compliance.Verify(raw, []attest.PublicKey{pub})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Time.Equal(p.Time) {
		t.Fatalf("report time %v, want the signed %v", rep.Time, p.Time)
	}
	now := p.Time.Add(3*time.Hour + 12*time.Minute)
	for _, c := range []struct {
		name string
		f    compliance.Freshness
		now  time.Time
		want []string // nil: passes
	}{
		{"no bound", compliance.Freshness{}, now.Add(1000 * time.Hour), nil},
		{"within max age", compliance.Freshness{MaxAge: 4 * time.Hour}, now, nil},
		{"older than max age", compliance.Freshness{MaxAge: time.Hour}, now,
			[]string{"issued 2026-12-03T12:00:00Z", "3h12m ago", "maximum age 1h", "--max-age"}},
		{"the default against a day-old bundle", compliance.Freshness{MaxAge: compliance.DefaultMaxAge}, p.Time.Add(26 * time.Hour),
			[]string{"26h ago", "maximum age 2h"}},
		{"just past max age", compliance.Freshness{MaxAge: time.Hour}, p.Time.Add(time.Hour + 30*time.Second),
			[]string{"1h0m30s ago", "maximum age 1h"}},
		{"after not-before", compliance.Freshness{NotBefore: p.Time.Add(-time.Minute)}, now, nil},
		{"at not-before", compliance.Freshness{NotBefore: p.Time}, now, nil},
		{"before not-before", compliance.Freshness{NotBefore: p.Time.Add(time.Hour)}, now,
			[]string{"issued 2026-12-03T12:00:00Z (3h12m ago)", "before the bound 2026-12-03T13:00:00Z", "--not-before"}},
		{"slightly in the future", compliance.Freshness{MaxAge: time.Hour}, p.Time.Add(-2 * time.Minute), nil},
		{"far in the future", compliance.Freshness{MaxAge: time.Hour}, p.Time.Add(-time.Hour),
			[]string{"1h in the future", "clock"}},
		{"in the future without a max age", compliance.Freshness{}, p.Time.Add(-time.Hour), nil},
	} {
		err := c.f.Check(rep, c.now)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if !errors.Is(err, compliance.ErrStale) {
			t.Errorf("%s: %v, want ErrStale", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
	}
}

// Ago and Span put an age the way people read one.
func TestAgo(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                 "just now",
		400 * time.Millisecond:            "just now",
		45 * time.Second:                  "45s ago",
		12*time.Minute + 30*time.Second:   "12m30s ago",
		time.Hour:                         "1h ago",
		3*time.Hour + 12*time.Minute + 59: "3h12m ago",
		47*time.Hour + 59*time.Minute:     "47h59m ago",
		48 * time.Hour:                    "2d ago",
		9*24*time.Hour + 4*time.Hour:      "9d4h ago",
		-10 * time.Minute:                 "10m in the future",
	} {
		if got := compliance.Ago(d); got != want {
			t.Errorf("Ago(%v) = %q, want %q", d, got, want)
		}
	}
}
