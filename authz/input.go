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
	Resource map[string]any `json:"resource"` // records involved, from the gateway's DescribeFunc; nil means {} (or Scope's)
	Time     time.Time      `json:"time"`     // zero means the engine's clock at evaluation
	Gateway  Gateway        `json:"gateway"`  // set by Engine.Authorize; see Gateway
	// Scope, if set, is the resource of a connect or renew, typed (see
	// Scope): the engine reads input.resource from it and ignores
	// Resource, which the gateway leaves nil for such a call (ResourceMap
	// builds the map when something needs one). It is not encoded as
	// such: encoding/json shows Resource.
	Scope *Scope `json:"-"`
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
	if in.Scope != nil {
		res = typedResource(in.Scope)
	} else if in.Resource != nil {
		t, err := termCache{}.term(in.Resource)
		if err != nil {
			return nil, fmt.Errorf("resource: %w", err)
		}
		res = t.Value
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
		ast.Item(kCaller, callerTerm(c)),
		ast.Item(kRPC, rpcTerm(in.RPC)),
		ast.Item(kAction, ast.StringTerm(action)),
		ast.Item(kResource, ast.NewTerm(res)),
		ast.Item(kTime, ast.StringTerm(t.UTC().Format(time.RFC3339Nano))),
		ast.Item(kGateway, ast.NewTerm(ast.NewObject(
			ast.Item(kTrustDomain, ast.StringTerm(gw.TrustDomain)),
		))),
	), nil
}

// resourceKeys are the keys of input.resource (policy/README.md), as terms
// built once: every request's resource repeats them, once per namespace.
var resourceKeys = func() map[string]*ast.Term {
	m := map[string]*ast.Term{}
	for _, k := range []string{
		"kind", "tenant", "target", "subsystem", "namespaces", "job", "nodes", "host_binding", "request",
		"id", "region", "fabric", "driver", "nqn", "target_id", "dhchap", "tls",
		"subsystem_nqn", "nsid", "data_class", "dataset", "name", "digest", "qos", "max_iops", "max_mbps", "mode",
		"job_id", "scheduler", "allowed_regions", "expires_at", "state",
		"spiffe_id", "host_nqn", "bound", "ttl",
	} {
		m[k] = ast.StringTerm(k)
	}
	return m
}()

// termCache converts a resource as ast.InterfaceToValue does, but with one
// term per distinct string: the keys, and values such as the tenant, region,
// class and subsystem NQN that every namespace of a request repeats. Terms
// are never modified once built, so sharing them is safe; it saves about a
// third of the allocations of converting a connect's resource.
type termCache map[string]*ast.Term

func (c termCache) str(s string) *ast.Term {
	if t, ok := resourceKeys[s]; ok {
		return t
	}
	if t, ok := c[s]; ok {
		return t
	}
	t := ast.StringTerm(s)
	c[s] = t
	return t
}

func (c termCache) term(x any) (*ast.Term, error) {
	switch v := x.(type) {
	case string:
		return c.str(v), nil
	case map[string]any:
		kvs := make([][2]*ast.Term, 0, len(v))
		for k, e := range v {
			t, err := c.term(e)
			if err != nil {
				return nil, err
			}
			kvs = append(kvs, [2]*ast.Term{c.str(k), t})
		}
		return ast.NewTerm(ast.NewObject(kvs...)), nil
	case []any:
		ts := make([]*ast.Term, len(v))
		for i, e := range v {
			t, err := c.term(e)
			if err != nil {
				return nil, err
			}
			ts[i] = t
		}
		return ast.NewTerm(ast.NewArray(ts...)), nil
	case []string:
		ts := make([]*ast.Term, len(v))
		for i, e := range v {
			ts[i] = c.str(e)
		}
		return ast.NewTerm(ast.NewArray(ts...)), nil
	}
	val, err := ast.InterfaceToValue(x)
	if err != nil {
		return nil, err
	}
	return ast.NewTerm(val), nil
}

// callerTerm is input.caller.
func callerTerm(c *Caller) *ast.Term {
	return ast.NewTerm(ast.NewObject(
		ast.Item(kID, ast.StringTerm(c.ID)),
		ast.Item(kTrustDomain, ast.StringTerm(c.TrustDomain)),
		ast.Item(kRole, ast.InternedTerm(c.Role)),
		ast.Item(kTenant, ast.StringTerm(c.Tenant)),
		ast.Item(kName, ast.StringTerm(c.Name)),
	))
}

// rpcTerm is input.rpc.
func rpcTerm(r RPC) *ast.Term {
	return ast.NewTerm(ast.NewObject(
		ast.Item(kService, ast.StringTerm(r.Service)),
		ast.Item(kMethod, ast.StringTerm(r.Method)),
		ast.Item(kFullMethod, ast.StringTerm(r.FullMethod)),
	))
}
