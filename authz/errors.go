package authz

import (
	"errors"
	"fmt"
	"strings"
)

// Errors returned by this package.
var (
	// ErrConfig: NewEngine was given unusable Options (e.g. no trust
	// domain). Fix the configuration.
	ErrConfig = errors.New("authz: invalid configuration")

	// ErrCompile: the policy bundle does not compile (syntax or type error,
	// strict-mode violation, a forbidden builtin), or a rule of a memoized
	// part of a split decision depends on the caller, the time or a
	// nondeterministic builtin (the message names the rule; see split.go).
	// Returned by NewEngine and Reload; a running engine keeps its previous
	// revision.
	ErrCompile = errors.New("authz: policy does not compile")

	// ErrData: the policy's checks of its own data (LoadCheckQuery) found
	// problems, e.g. a data class whose max_ttl is not a duration; the
	// error lists them. Returned by NewEngine and Reload; a running engine
	// keeps its previous revision.
	ErrData = errors.New("authz: policy data is invalid")

	// ErrSelfTest: the policy compiled but decided a self-test sample
	// differently from selftest.json, or produced a malformed decision for
	// it. The error is a *SelfTestError naming the sample. Returned by
	// NewEngine and Reload; a running engine keeps its previous revision.
	ErrSelfTest = errors.New("authz: policy failed its self-test")

	// ErrEvaluation: Authorize could not evaluate the policy (an OPA
	// evaluation error or an input it could not build). Authorize still
	// returns a denying Decision to record; the caller must treat the
	// request as failed (an internal error), not as an ordinary denial.
	ErrEvaluation = errors.New("authz: policy evaluation failed")

	// ErrHeld: the engine is held (Engine.Hold) and decides nothing: its
	// replica could not load the policy in force. The interceptors answer
	// codes.Unavailable (another replica can decide).
	ErrHeld = errors.New("authz: this gateway replica cannot load the policy in force")
)

// SelfTestError reports the self-test sample a policy revision got wrong.
// errors.Is(err, ErrSelfTest) holds for it.
type SelfTestError struct {
	Revision string   // the refused bundle's revision
	Sample   string   // the failing sample's name
	Problem  string   // what went wrong, e.g. "got allow=true, want allow=false"
	Reasons  []string // the reasons the policy gave, if it decided
	Err      error    // the underlying error, if evaluation failed
}

func (e *SelfTestError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "authz: policy %s failed self-test sample %q: %s", e.Revision, e.Sample, e.Problem)
	if len(e.Reasons) > 0 {
		fmt.Fprintf(&b, " (reasons %q)", e.Reasons)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns ErrSelfTest and the underlying error.
func (e *SelfTestError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrSelfTest, e.Err}
	}
	return []error{ErrSelfTest}
}
