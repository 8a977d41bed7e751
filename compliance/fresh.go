package compliance

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// DefaultMaxAge is the age past which a verifier refuses an attestation
// unless told otherwise (nvmegate attest verify --max-age). A verified
// bundle proves what the fabric was when it was signed, not that it still
// is: without a bound, a bundle saved while the fabric complied verifies
// "OK" for ever, and whoever holds one can replay it as today's (issue 29).
// The gateway signs an attestation every hour and on demand, so a current
// one is at most an hour old; two hours lets one hourly run be missed or
// late and still refuses yesterday's. Verifying archived evidence is a
// different question and asks for it explicitly (--max-age 0: no bound;
// the age is still shown).
const DefaultMaxAge = 2 * time.Hour

// ClockSkew is how far in the future an attestation's time may be when a
// maximum age applies: the signer's clock and the verifier's differ a
// little. Further ahead, its age cannot be judged, and it is refused.
const ClockSkew = 5 * time.Minute

// ErrStale is wrapped by every refusal of Freshness.Check.
var ErrStale = errors.New("compliance: not fresh enough")

// Freshness bounds when an attestation may have been made. Both bounds
// are judged against the attestation's time, which its signed predicate
// states (Report.Time).
type Freshness struct {
	// MaxAge refuses an attestation made longer than MaxAge before now,
	// or more than ClockSkew after it. Zero: no bound.
	MaxAge time.Duration
	// NotBefore refuses an attestation made before it (a verifier that
	// saw a change at that time wants a statement made after it). Zero:
	// no bound.
	NotBefore time.Time
}

// Check refuses r if it was made outside f's bounds, measured at now; the
// error says when it was made, how long ago, and the bound it broke.
func (f Freshness) Check(r *Report, now time.Time) error {
	age := now.Sub(r.Time)
	issued := r.Time.UTC().Format(time.RFC3339)
	if !f.NotBefore.IsZero() && r.Time.Before(f.NotBefore) {
		return fmt.Errorf("%w: issued %s (%s), before the bound %s (--not-before)", ErrStale, issued, Ago(age), f.NotBefore.UTC().Format(time.RFC3339))
	}
	if f.MaxAge > 0 {
		if age > f.MaxAge {
			old := Span(age)
			if old == Span(f.MaxAge) {
				old = age.Round(time.Second).String() // just past the bound
			}
			return fmt.Errorf("%w: issued %s, %s ago, older than the maximum age %s (--max-age)", ErrStale, issued, old, Span(f.MaxAge))
		}
		if -age > ClockSkew {
			return fmt.Errorf("%w: issued %s, %s in the future: the signer's clock or this one is wrong, so its age cannot be judged", ErrStale, issued, Span(-age))
		}
	}
	return nil
}

// Ago says how long before now something was made: "3h12m ago", "40s
// ago", "just now", or "10m in the future" for a negative age.
func Ago(age time.Duration) string {
	switch {
	case age < 0 && -age >= time.Second:
		return Span(-age) + " in the future"
	case age < time.Second:
		return "just now"
	}
	return Span(age) + " ago"
}

// Span is a duration as people read an age: whole seconds under an hour,
// whole minutes under two days, then days and hours ("45s", "12m30s",
// "3h12m", "2h", "9d4h").
func Span(d time.Duration) string {
	d = d.Abs()
	switch {
	case d < time.Hour:
		return strings.Replace(d.Round(time.Second).String(), "m0s", "m", 1) // "10m", not "10m0s"
	case d < 48*time.Hour:
		s := d.Truncate(time.Minute).String() // "3h12m0s"
		s = strings.TrimSuffix(s, "0s")
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	}
	days := d / (24 * time.Hour)
	hours := (d % (24 * time.Hour)) / time.Hour
	if hours == 0 {
		return fmt.Sprintf("%dd", days)
	}
	return fmt.Sprintf("%dd%dh", days, hours)
}
