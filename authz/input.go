package authz

import (
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Input is the one policy input document of a request (input in Rego). The
// JSON names are the names policy sees; doc.go describes every field.
type Input struct {
	Caller   Caller         `json:"caller"`
	RPC      RPC            `json:"rpc"`
	Action   string         `json:"action"`   // e.g. "inventory.add_target"; "" means ActionFromMethod(RPC.FullMethod)
	Resource map[string]any `json:"resource"` // records involved, from the gateway's DescribeFunc; nil means {}
	Time     time.Time      `json:"time"`     // zero means the engine's clock at evaluation
	Gateway  Gateway        `json:"gateway"`  // set by Engine.Authorize; see Gateway
}

// RPC names the gRPC method of a request.
type RPC struct {
	Service    string `json:"service"`     // "nvmegate.v1.Inventory"
	Method     string `json:"method"`      // "AddTarget"
	FullMethod string `json:"full_method"` // "/nvmegate.v1.Inventory/AddTarget"
}

// Gateway describes the gateway that evaluates the request. Engine.Authorize
// always sets it from its Options, whatever the caller put there; only the
// engine's self-test samples supply their own, so that they do not depend on
// the deployment's trust domain.
type Gateway struct {
	TrustDomain string `json:"trust_domain"` // the gateway's own SPIFFE trust domain
}

// NewInput returns the input for a call of fullMethod by c. An empty action
// is derived from the method (ActionFromMethod).
func NewInput(c Caller, fullMethod, action string, resource map[string]any) *Input {
	if action == "" {
		action = ActionFromMethod(fullMethod)
	}
	return &Input{Caller: c, RPC: ParseFullMethod(fullMethod), Action: action, Resource: resource}
}

// ParseFullMethod splits a gRPC method name "/pkg.Service/Method". A
// malformed name yields empty Service and Method (which policy denies).
func ParseFullMethod(fullMethod string) RPC {
	r := RPC{FullMethod: fullMethod}
	rest, ok := strings.CutPrefix(fullMethod, "/")
	if !ok {
		return r
	}
	svc, m, ok := strings.Cut(rest, "/")
	if !ok || svc == "" || m == "" || strings.Contains(m, "/") {
		return r
	}
	r.Service, r.Method = svc, m
	return r
}

// ActionFromMethod derives the default action of a gRPC method: the last
// element of the service name and the method, in snake case, joined by a
// dot: "/nvmegate.v1.Inventory/AddTarget" -> "inventory.add_target",
// "/grpc.health.v1.Health/Check" -> "health.check". A malformed method name
// yields "".
func ActionFromMethod(fullMethod string) string {
	r := ParseFullMethod(fullMethod)
	if r.Service == "" {
		return ""
	}
	svc := r.Service
	if i := strings.LastIndexByte(svc, '.'); i >= 0 {
		svc = svc[i+1:]
	}
	return snake(svc) + "." + snake(r.Method)
}

// snake converts a Go/proto identifier to snake case: "AddTarget" ->
// "add_target", "GetTLSKey" -> "get_tls_key".
func snake(s string) string {
	rs := []rune(s)
	var b strings.Builder
	b.Grow(len(s) + 4)
	for i, r := range rs {
		if unicode.IsUpper(r) {
			if i > 0 && rs[i-1] != '_' &&
				(unicode.IsLower(rs[i-1]) || unicode.IsDigit(rs[i-1]) ||
					(i+1 < len(rs) && unicode.IsLower(rs[i+1]))) {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Keys of the input document, built once.
var (
	kCaller      = ast.StringTerm("caller")
	kRPC         = ast.StringTerm("rpc")
	kAction      = ast.StringTerm("action")
	kResource    = ast.StringTerm("resource")
	kTime        = ast.StringTerm("time")
	kGateway     = ast.StringTerm("gateway")
	kID          = ast.StringTerm("id")
	kTrustDomain = ast.StringTerm("trust_domain")
	kRole        = ast.StringTerm("role")
	kTenant      = ast.StringTerm("tenant")
	kName        = ast.StringTerm("name")
	kService     = ast.StringTerm("service")
	kMethod      = ast.StringTerm("method")
	kFullMethod  = ast.StringTerm("full_method")
)

// value builds the input document as an OPA value directly, without a JSON
// round trip (see BenchmarkInputConversion). gw is the gateway description
// to use and now fills a zero Time.
func (in *Input) value(gw Gateway, now time.Time) (ast.Value, error) {
	var res ast.Value = ast.NewObject()
	if in.Resource != nil {
		v, err := ast.InterfaceToValue(in.Resource)
		if err != nil {
			return nil, fmt.Errorf("resource: %w", err)
		}
		res = v
	}
	t := in.Time
	if t.IsZero() {
		t = now
	}
	action := in.Action
	if action == "" {
		action = ActionFromMethod(in.RPC.FullMethod)
	}
	c := &in.Caller
	return ast.NewObject(
		ast.Item(kCaller, ast.NewTerm(ast.NewObject(
			ast.Item(kID, ast.StringTerm(c.ID)),
			ast.Item(kTrustDomain, ast.StringTerm(c.TrustDomain)),
			ast.Item(kRole, ast.InternedTerm(c.Role)),
			ast.Item(kTenant, ast.StringTerm(c.Tenant)),
			ast.Item(kName, ast.StringTerm(c.Name)),
		))),
		ast.Item(kRPC, ast.NewTerm(ast.NewObject(
			ast.Item(kService, ast.StringTerm(in.RPC.Service)),
			ast.Item(kMethod, ast.StringTerm(in.RPC.Method)),
			ast.Item(kFullMethod, ast.StringTerm(in.RPC.FullMethod)),
		))),
		ast.Item(kAction, ast.StringTerm(action)),
		ast.Item(kResource, ast.NewTerm(res)),
		ast.Item(kTime, ast.StringTerm(t.UTC().Format(time.RFC3339Nano))),
		ast.Item(kGateway, ast.NewTerm(ast.NewObject(
			ast.Item(kTrustDomain, ast.StringTerm(gw.TrustDomain)),
		))),
	), nil
}
