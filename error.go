package nvmegate

import (
	"errors"
	"fmt"
)

// Error codes. They are transport-neutral; the gateway maps each to one gRPC
// status code in exactly one place (gateway/status.go).
const (
	// EINVALID: the request is malformed. Error.Field names the offending
	// field; the caller must fix the request before retrying.
	EINVALID = "invalid"
	// ENOTFOUND: the named record does not exist.
	ENOTFOUND = "not_found"
	// EEXISTS: a record with the same key already exists.
	EEXISTS = "exists"
	// ECONFLICT: the change conflicts with other records (a target still
	// referenced by subsystems, a host NQN bound to another identity).
	// Retrying the same request will fail until the other records change.
	ECONFLICT = "conflict"
	// EPERMISSION: the caller is authenticated but policy denies the action.
	EPERMISSION = "permission"
	// EUNAUTHENTICATED: no verified caller identity is attached.
	EUNAUTHENTICATED = "unauthenticated"
	// EUNAVAILABLE: a dependency is down or a bound was exceeded; the caller
	// may retry later. The gateway never grants on this path (fail closed).
	EUNAVAILABLE = "unavailable"
	// EEXHAUSTED: the caller (its identity, or its role's callers
	// together) already has as many calls under way as its share of the
	// gateway allows; refused at once, without waiting. The caller may
	// retry when one of its calls has ended.
	EEXHAUSTED = "exhausted"
	// EUNIMPLEMENTED: the operation exists in the API but is not built yet.
	EUNIMPLEMENTED = "unimplemented"
	// EINTERNAL: a bug or an unexpected failure. Details go to the log, never
	// to the caller.
	EINTERNAL = "internal"
)

// Error is the error type of the domain. Message is safe to show to the
// caller: it never contains secret material, and an internal error's message
// is replaced before it leaves the gateway.
type Error struct {
	Code    string // one of the E* codes
	Field   string // for EINVALID: the field path, e.g. "namespace.region"
	Message string // human-readable, safe for the caller
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s", e.Field, e.Message)
	}
	return e.Message
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an EINVALID error for field; format says which rule failed.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: EINVALID, Field: field, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, EINTERNAL for
// any other non-nil error and "" for nil.
func ErrorCode(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Code
	default:
		return EINTERNAL
	}
}

// ErrorMessage returns the caller-safe message of err: the *Error's text, or
// "internal error" for anything else so that internals never leak.
func ErrorMessage(err error) string {
	var e *Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &e):
		return e.Error()
	default:
		return "internal error"
	}
}

// WithFieldPrefix returns err with prefix+"." prepended to the field of an
// EINVALID *Error, so that a record's own validation ("region") names the
// field of the request that carried it ("namespace.region"). Other errors are
// returned unchanged.
func WithFieldPrefix(prefix string, err error) error {
	var e *Error
	if prefix == "" || !errors.As(err, &e) || e.Code != EINVALID {
		return err
	}
	f := prefix
	if e.Field != "" {
		f = prefix + "." + e.Field
	}
	return &Error{Code: e.Code, Field: f, Message: e.Message}
}
