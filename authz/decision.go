package authz

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/nvmegate/nvmegate"
)

// Reasons the engine gives when it denies on the policy's behalf (fail
// closed). The policy's own reasons never start with "policy ".
const (
	ReasonNoInput          = "policy input is missing"
	ReasonInputFailed      = "policy input could not be built"
	ReasonEvaluationFailed = "policy evaluation failed"
	ReasonCanceled         = "policy evaluation was canceled"
	reasonMalformed        = "policy decision is malformed: "
)

// Keys of the decision document and its obligations.
var (
	kAllow       = ast.StringTerm("allow")
	kReasons     = ast.StringTerm("reasons")
	kObligations = ast.StringTerm("obligations")
)

// Obligation keys (decision.obligations). Each is optional; absent means the
// gateway default, as in the zero nvmegate.Obligations.
const (
	oMaxTTL        = "max_ttl"       // string, Go duration > 0, e.g. "15m", "1h30m"
	oRequireTLS    = "require_tls"   // boolean
	oAuthMode      = "auth_mode"     // "dhchap" | "tls" | "both"
	oMinHash       = "min_hash"      // "sha256" | "sha384" | "sha512"
	oMinDHGroup    = "min_dh_group"  // "null" | "ffdhe2048" | ... | "ffdhe8192"
	oBidirectional = "bidirectional" // boolean
	oReadOnly      = "read_only"     // boolean
	oMaxIOPS       = "max_iops"      // integer >= 0; 0 = no cap
	oMaxMBps       = "max_mbps"      // integer >= 0; 0 = no cap
	oReauthWithin  = "reauth_within" // string, Go duration > 0: how long a grant under weaker obligations has to renew
)

var (
	authModes = map[string]bool{nvmegate.AuthDHCHAP: true, nvmegate.AuthTLS: true, nvmegate.AuthBoth: true}
	hashes    = map[string]bool{"sha256": true, "sha384": true, "sha512": true}
	dhGroups  = map[string]bool{"null": true, "ffdhe2048": true, "ffdhe3072": true,
		"ffdhe4096": true, "ffdhe6144": true, "ffdhe8192": true}
)

// outcome is a parsed decision document.
type outcome struct {
	allow       bool
	reasons     []string
	obligations nvmegate.Obligations
}

// termResult makes a prepared query return result values as *ast.Term, so
// the decision is read from the AST without converting it to Go values.
func termResult(t *ast.Term, _ *rego.EvalContext) (any, error) { return t, nil }

// parseResult reads the decision document from the result of the decision
// query. Any deviation from the documented shape is an error: the caller
// fails closed with it as the reason.
func parseResult(rs rego.ResultSet) (outcome, error) {
	if len(rs) == 0 {
		return outcome{}, errors.New("decision is undefined")
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return outcome{}, errors.New("decision query returned several results")
	}
	t, ok := rs[0].Expressions[0].Value.(*ast.Term)
	if !ok {
		return outcome{}, fmt.Errorf("unexpected result type %T", rs[0].Expressions[0].Value)
	}
	return parseDecision(t.Value)
}

func parseDecision(v ast.Value) (outcome, error) {
	var out outcome
	obj, ok := v.(ast.Object)
	if !ok {
		return out, fmt.Errorf("decision is %s, not an object", ast.ValueName(v))
	}
	allow, ok := value(obj, kAllow).(ast.Boolean)
	if !ok {
		return out, errors.New("allow is missing or not a boolean")
	}
	out.allow = bool(allow)

	arr, ok := value(obj, kReasons).(*ast.Array)
	if !ok {
		return out, errors.New("reasons is missing or not an array")
	}
	out.reasons = make([]string, 0, arr.Len())
	for i := range arr.Len() {
		s, ok := arr.Elem(i).Value.(ast.String)
		if !ok || s == "" {
			return out, fmt.Errorf("reasons[%d] is not a non-empty string", i)
		}
		out.reasons = append(out.reasons, string(s))
	}
	if !out.allow && len(out.reasons) == 0 {
		return out, errors.New("deny without reasons")
	}

	ob, ok := value(obj, kObligations).(ast.Object)
	if !ok {
		return out, errors.New("obligations is missing or not an object")
	}
	var err error
	if out.obligations, err = parseObligations(ob); err != nil {
		return outcome{}, err
	}
	if !out.allow {
		out.obligations = nvmegate.Obligations{} // nothing to oblige on a deny
	}
	return out, nil
}

// parseObligations converts decision.obligations. Every key must be known
// and well-typed: an obligation the gateway does not understand cannot be
// enforced, so it fails the decision.
func parseObligations(obj ast.Object) (nvmegate.Obligations, error) {
	var o nvmegate.Obligations
	var problem string
	fail := func(format string, args ...any) {
		if problem == "" {
			problem = fmt.Sprintf(format, args...)
		}
	}
	obj.Foreach(func(k, v *ast.Term) {
		key, ok := k.Value.(ast.String)
		if !ok {
			fail("obligations has a non-string key %v", k)
			return
		}
		switch name := string(key); name {
		case oMaxTTL:
			o.MaxTTL = durationOb(name, v, fail)
		case oReauthWithin:
			o.ReauthWithin = durationOb(name, v, fail)
		case oRequireTLS:
			o.RequireTLS = boolOb(name, v, fail)
		case oBidirectional:
			o.Bidirectional = boolOb(name, v, fail)
		case oReadOnly:
			o.ReadOnly = boolOb(name, v, fail)
		case oAuthMode:
			o.AuthMode = enumOb(name, v, authModes, fail)
		case oMinHash:
			o.MinHash = enumOb(name, v, hashes, fail)
		case oMinDHGroup:
			o.MinDHGroup = enumOb(name, v, dhGroups, fail)
		case oMaxIOPS:
			o.MaxIOPS = uintOb(name, v, fail)
		case oMaxMBps:
			o.MaxMBps = uintOb(name, v, fail)
		default:
			fail("unknown obligation %q", name)
		}
	})
	if problem != "" {
		return nvmegate.Obligations{}, errors.New(problem)
	}
	return o, nil
}

func durationOb(name string, v *ast.Term, fail func(string, ...any)) time.Duration {
	s, ok := v.Value.(ast.String)
	d, err := time.ParseDuration(string(s))
	if !ok || err != nil || d <= 0 {
		fail("obligations.%s must be a positive Go duration string like \"15m\" (got %v)", name, v)
		return 0
	}
	return d
}

func boolOb(name string, v *ast.Term, fail func(string, ...any)) bool {
	b, ok := v.Value.(ast.Boolean)
	if !ok {
		fail("obligations.%s must be a boolean (got %v)", name, v)
	}
	return bool(b)
}

func enumOb(name string, v *ast.Term, allowed map[string]bool, fail func(string, ...any)) string {
	s, ok := v.Value.(ast.String)
	if !ok || !allowed[string(s)] {
		fail("obligations.%s has an unknown value %v", name, v)
		return ""
	}
	return string(s)
}

func uintOb(name string, v *ast.Term, fail func(string, ...any)) uint64 {
	n, ok := v.Value.(ast.Number)
	if !ok {
		fail("obligations.%s must be a non-negative integer (got %v)", name, v)
		return 0
	}
	u, err := strconv.ParseUint(string(n), 10, 64)
	if err != nil {
		fail("obligations.%s must be a non-negative integer (got %v)", name, v)
		return 0
	}
	return u
}

func value(obj ast.Object, k *ast.Term) ast.Value {
	if t := obj.Get(k); t != nil {
		return t.Value
	}
	return nil
}

// newDecisionID returns a UUIDv7 (RFC 9562) for a decision made at now:
// 48 bits of Unix milliseconds, then 74 random bits, so IDs sort by time
// in logs and audit entries and cannot be guessed.
func newDecisionID(now time.Time) string {
	var u uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(now.UnixMilli()))
	copy(u[:6], ms[2:])
	rand.Read(u[6:])        // never fails (crypto/rand, Go ≥ 1.24)
	u[6] = u[6]&0x0f | 0x70 // version 7
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return u.String()
}
