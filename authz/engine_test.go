package authz_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/policy"
)

var (
	td      = spiffeid.RequireTrustDomainFromString("example.org")
	epoch   = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)
	uuid7RE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
)

// clock is a fake clock tests advance by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newEngine returns an engine serving b (nil: the embedded policy) with a
// fake clock and a log buffer.
func newEngine(t testing.TB, b *policy.Bundle) (*authz.Engine, *clock, *bytes.Buffer) {
	t.Helper()
	clk := &clock{t: epoch}
	var buf bytes.Buffer
	e, err := authz.NewEngine(context.Background(), authz.Options{
		TrustDomain: td,
		Bundle:      b,
		Logger:      slog.New(slog.NewTextHandler(&syncWriter{w: &buf}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Now:         clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return e, clk, &buf
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func input(id, fullMethod string) *authz.Input {
	return authz.NewInput(authz.ParseCaller(spiffeid.RequireFromString(id)), fullMethod, "", nil)
}

func TestEngineDefaultPolicy(t *testing.T) {
	e, clk, _ := newEngine(t, nil)
	const (
		admin     = "spiffe://example.org/admin/alice"
		node      = "spiffe://example.org/node/gpu-01"
		auditor   = "spiffe://example.org/auditor/eve"
		scheduler = "spiffe://example.org/tenant/acme/scheduler/slurm"
		target    = "spiffe://example.org/target/t1"
		gateway   = "spiffe://example.org/gateway/gw-2"
		unknown   = "spiffe://example.org/workload/x"
		foreign   = "spiffe://evil.example/admin/alice"
	)
	health := func(a string) []string { return []string{"any caller of trust domain example.org may perform " + a} }
	for _, tc := range []struct {
		id, method string
		allow      bool
		reasons    []string
	}{
		{admin, "/nvmegate.v1.Inventory/AddTarget", true, []string{"role admin may perform inventory.add_target"}},
		{admin, "/nvmegate.v1.Inventory/ListNamespaces", true, []string{"role admin may perform inventory.list_namespaces"}},
		{admin, "/nvmegate.v1.Policy/Explain", true, []string{"role admin may perform policy.explain"}},
		{admin, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", true, []string{"role admin may perform server_reflection.server_reflection_info"}},
		{admin, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", true, []string{"role admin may perform server_reflection.server_reflection_info"}},
		{admin, "/grpc.health.v1.Health/Check", true, health("health.check")},
		{node, "/grpc.health.v1.Health/Check", true, health("health.check")},
		{node, "/grpc.health.v1.Health/Watch", true, health("health.watch")},
		{unknown, "/grpc.health.v1.Health/Check", true, health("health.check")},
		{gateway, "/grpc.health.v1.Health/Check", true, health("health.check")},
		{auditor, "/nvmegate.v1.Audit/Query", true, []string{"role auditor may perform audit.query"}},

		{node, "/nvmegate.v1.Inventory/AddTarget", false, []string{"no rule allows role node to perform inventory.add_target"}},
		{auditor, "/nvmegate.v1.Inventory/ListTargets", false, []string{"no rule allows role auditor to perform inventory.list_targets"}},
		{scheduler, "/nvmegate.v1.Policy/Explain", false, []string{"no rule allows role scheduler to perform policy.explain"}},
		{target, "/nvmegate.v1.Inventory/AddTarget", false, []string{"no rule allows role target to perform inventory.add_target"}},
		{gateway, "/nvmegate.v1.Inventory/AddTarget", false, []string{"no rule allows role gateway to perform inventory.add_target"}},
		{unknown, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", false, []string{"no rule allows role unknown to perform server_reflection.server_reflection_info"}},
		{node, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", false, []string{"no rule allows role node to perform server_reflection.server_reflection_info"}},
		{admin, "/nvmegate.v1.Access/Connect", false, []string{"no rule allows role admin to perform access.connect"}},
		{"spiffe://example.org/admin/x/y", "/nvmegate.v1.Inventory/AddTarget", false, []string{"no rule allows role unknown to perform inventory.add_target"}},
		{foreign, "/nvmegate.v1.Inventory/AddTarget", false, []string{"caller trust domain evil.example is not the gateway's trust domain example.org"}},
		{"spiffe://evil.example/node/n", "/grpc.health.v1.Health/Check", false, []string{"caller trust domain evil.example is not the gateway's trust domain example.org"}},
		{admin, "not-a-method", false, []string{"request names no RPC method", "request names no RPC service", "request names no action"}},
	} {
		t.Run(tc.id+tc.method, func(t *testing.T) {
			clk.Add(time.Second)
			d, err := e.Authorize(context.Background(), input(tc.id, tc.method))
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != tc.allow || !slices.Equal(d.Reasons, tc.reasons) {
				t.Errorf("got allow=%t %q, want allow=%t %q", d.Allow, d.Reasons, tc.allow, tc.reasons)
			}
			checkDecision(t, e, d, clk.Now())
			if d.Obligations != (nvmegate.Obligations{}) {
				t.Errorf("obligations %+v", d.Obligations)
			}
		})
	}
}

// checkDecision checks the invariants of every decision.
func checkDecision(t *testing.T, e *authz.Engine, d *nvmegate.Decision, now time.Time) {
	t.Helper()
	if !uuid7RE.MatchString(d.ID) {
		t.Errorf("decision ID %q is not a UUIDv7", d.ID)
	}
	if d.PolicyRevision != e.Status().Revision {
		t.Errorf("revision %q, engine serves %q", d.PolicyRevision, e.Status().Revision)
	}
	if !d.EvaluatedAt.Equal(now) {
		t.Errorf("evaluated at %v, want %v", d.EvaluatedAt, now)
	}
	if !d.Allow && len(d.Reasons) == 0 {
		t.Error("deny without reasons")
	}
}

func TestEngineGarbledCaller(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	good := authz.ParseCaller(spiffeid.RequireFromString("spiffe://example.org/admin/alice"))
	for _, tc := range []struct {
		name   string
		mutate func(*authz.Caller)
		reason string
	}{
		{"empty role", func(c *authz.Caller) { c.Role = "" }, "caller has no role"},
		{"empty ID", func(c *authz.Caller) { c.ID = "" }, "caller has no SPIFFE ID"},
		{"empty trust domain", func(c *authz.Caller) { c.TrustDomain = "" }, "caller has no trust domain"},
		{"zero caller", func(c *authz.Caller) { *c = authz.Caller{} }, "caller has no SPIFFE ID"},
		{"admin of a foreign trust domain", func(c *authz.Caller) {
			c.ID, c.TrustDomain = "spiffe://evil.example/admin/alice", "evil.example"
		}, "caller trust domain evil.example is not the gateway's trust domain example.org"},
		{"ID outside its trust domain", func(c *authz.Caller) { c.ID = "spiffe://evil.example/admin/alice" },
			"caller SPIFFE ID is not in the caller's trust domain"},
		{"ID in a look-alike trust domain", func(c *authz.Caller) { c.ID = "spiffe://example.org.evil/admin/alice" },
			"caller SPIFFE ID is not in the caller's trust domain"},
		{"claimed trust domain matches the gateway, ID does not", func(c *authz.Caller) {
			c.ID = "spiffe://evil.example/admin/alice"
			c.TrustDomain = "example.org"
		}, "caller SPIFFE ID is not in the caller's trust domain"},
		{"role case", func(c *authz.Caller) { c.Role = "ADMIN" },
			"no rule allows role ADMIN to perform inventory.add_target"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mutate(&c)
			d, err := e.Authorize(context.Background(), authz.NewInput(c, "/nvmegate.v1.Inventory/AddTarget", "", nil))
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow || !slices.Contains(d.Reasons, tc.reason) {
				t.Errorf("got allow=%t %q, want a deny with %q", d.Allow, d.Reasons, tc.reason)
			}
		})
	}
	// The gateway description cannot be forged through the input.
	c := good
	c.ID, c.TrustDomain = "spiffe://evil.example/admin/alice", "evil.example"
	in := authz.NewInput(c, "/nvmegate.v1.Inventory/AddTarget", "", nil)
	in.Gateway.TrustDomain = "evil.example"
	if d, _ := e.Authorize(context.Background(), in); d.Allow {
		t.Error("input.gateway from the caller was honoured")
	}
	// Neither is a nil input allowed.
	d, err := e.Authorize(context.Background(), nil)
	if !errors.Is(err, authz.ErrEvaluation) || d == nil || d.Allow || d.Reasons[0] != authz.ReasonNoInput {
		t.Errorf("nil input: %+v, %v", d, err)
	}
}

func TestEngineInputDocument(t *testing.T) {
	// A policy that echoes its input in the reasons shows what Rego sees.
	b := bundle(t, map[string]string{"echo.rego": `package nvmegate.authz
decision := {"allow": input.action == "ok", "reasons": [json.marshal(input)], "obligations": {}}
`}, allowSample(`{"action": "ok"}`), denySample(`{"action": "no"}`))
	e, _, _ := newEngine(t, b)
	in := input("spiffe://example.org/tenant/acme/scheduler/slurm", "/nvmegate.v1.Jobs/Admit")
	in.Resource = map[string]any{"job": map[string]any{"id": "j1", "nodes": []string{"a", "b"}, "n": 3}}
	in.Time = time.Date(2026, 10, 1, 12, 0, 0, 5, time.FixedZone("x", 3600))
	d, err := e.Authorize(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(d.Reasons[0]), &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	json.Unmarshal([]byte(`{
	 "caller": {"id": "spiffe://example.org/tenant/acme/scheduler/slurm", "trust_domain": "example.org",
	            "role": "scheduler", "tenant": "acme", "name": "slurm"},
	 "rpc": {"service": "nvmegate.v1.Jobs", "method": "Admit", "full_method": "/nvmegate.v1.Jobs/Admit"},
	 "action": "jobs.admit",
	 "resource": {"job": {"id": "j1", "nodes": ["a", "b"], "n": 3}},
	 "time": "2026-10-01T11:00:00.000000005Z",
	 "gateway": {"trust_domain": "example.org"}}`), &want)
	if !jsonEqual(got, want) {
		t.Errorf("input document:\n got %v\nwant %v", got, want)
	}
	// The document is what encoding/json makes of Input, but for the
	// engine's gateway and the UTC time.
	in.Gateway.TrustDomain = "example.org"
	in.Time = in.Time.UTC()
	raw, _ := json.Marshal(in)
	var viaJSON map[string]any
	json.Unmarshal(raw, &viaJSON)
	if !jsonEqual(viaJSON, want) {
		t.Errorf("json.Marshal(Input):\n got %v\nwant %v", viaJSON, want)
	}

	// Without a time, the engine's clock; without a resource, {}.
	d, _ = e.Authorize(context.Background(), input("spiffe://example.org/node/n", "/a.B/C"))
	json.Unmarshal([]byte(d.Reasons[0]), &got)
	if got["time"] != "2026-10-01T12:00:00Z" || !jsonEqual(got["resource"], map[string]any{}) || got["action"] != "b.c" {
		t.Errorf("defaults: %v", got)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// --- Bundles for failure tests ----------------------------------------------

type sample struct {
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Allow   bool            `json:"allow"`
	Reasons []string        `json:"reasons,omitempty"`
}

func allowSample(in string) sample {
	return sample{Name: "allow " + in, Input: json.RawMessage(in), Allow: true}
}
func denySample(in string) sample {
	return sample{Name: "deny " + in, Input: json.RawMessage(in), Allow: false}
}

func bundle(t testing.TB, modules map[string]string, samples ...sample) *policy.Bundle {
	t.Helper()
	fsys := fstest.MapFS{}
	for k, v := range modules {
		fsys[k] = &fstest.MapFile{Data: []byte(v)}
	}
	st, _ := json.Marshal(map[string]any{"samples": samples})
	fsys["selftest.json"] = &fstest.MapFile{Data: st}
	b, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// passthrough's decision is input.resource.decision, so a test can make the
// real engine see any decision document. Its samples pass.
const passthrough = `package nvmegate.authz
decision := input.resource.decision
`

func passthroughBundle(t testing.TB) *policy.Bundle {
	return bundle(t, map[string]string{"p.rego": passthrough},
		allowSample(`{"resource": {"decision": {"allow": true, "reasons": [], "obligations": {}}}}`),
		denySample(`{"resource": {"decision": {"allow": false, "reasons": ["no"], "obligations": {}}}}`))
}

func TestEngineMalformedDecisions(t *testing.T) {
	e, _, log := newEngine(t, passthroughBundle(t))
	for _, doc := range []string{
		`null`,
		`"allow"`,
		`true`,
		`[true]`,
		`{}`,
		`{"reasons": ["r"], "obligations": {}}`,
		`{"allow": "true", "reasons": [], "obligations": {}}`,
		`{"allow": 1, "reasons": [], "obligations": {}}`,
		`{"allow": null, "reasons": [], "obligations": {}}`,
		`{"allow": true, "obligations": {}}`,
		`{"allow": true, "reasons": "r", "obligations": {}}`,
		`{"allow": true, "reasons": [1], "obligations": {}}`,
		`{"allow": true, "reasons": [""], "obligations": {}}`,
		`{"allow": true, "reasons": []}`,
		`{"allow": true, "reasons": [], "obligations": []}`,
		`{"allow": true, "reasons": [], "obligations": null}`,
		`{"allow": false, "reasons": [], "obligations": {}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_ttl": 3600}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_ttl": "1 hour"}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_ttl": "-1h"}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_ttl": "0s"}}`,
		`{"allow": true, "reasons": [], "obligations": {"require_tls": "yes"}}`,
		`{"allow": true, "reasons": [], "obligations": {"read_only": 1}}`,
		`{"allow": true, "reasons": [], "obligations": {"bidirectional": null}}`,
		`{"allow": true, "reasons": [], "obligations": {"auth_mode": "chap"}}`,
		`{"allow": true, "reasons": [], "obligations": {"min_hash": "md5"}}`,
		`{"allow": true, "reasons": [], "obligations": {"min_dh_group": "ffdhe1024"}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_iops": -1}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_iops": 1.5}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_mbps": "100"}}`,
		`{"allow": true, "reasons": [], "obligations": {"max_mbps": 18446744073709551616}}`,
		`{"allow": true, "reasons": [], "obligations": {"encrypt_at_rest": true}}`,
		`{"allow": true, "reasons": [], "obligations": {"require_tls": true, "mystery": 1}}`,
	} {
		t.Run(doc, func(t *testing.T) {
			in := input("spiffe://example.org/admin/a", "/s.S/M")
			in.Resource = map[string]any{"decision": mustJSON(t, doc)}
			d, err := e.Authorize(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow || len(d.Reasons) != 1 || !strings.HasPrefix(d.Reasons[0], "policy decision is malformed: ") {
				t.Errorf("got allow=%t %q, want a malformed-decision deny", d.Allow, d.Reasons)
			}
			if d.Obligations != (nvmegate.Obligations{}) {
				t.Errorf("obligations on a deny: %+v", d.Obligations)
			}
		})
	}
	// Undefined: no decision key at all.
	d, err := e.Authorize(context.Background(), input("spiffe://example.org/admin/a", "/s.S/M"))
	if err != nil || d.Allow || d.Reasons[0] != "policy decision is malformed: decision is undefined" {
		t.Errorf("undefined decision: %+v, %v", d, err)
	}
	if !strings.Contains(log.String(), "malformed policy decision") {
		t.Error("malformed decisions were not logged")
	}
}

func TestEngineObligations(t *testing.T) {
	e, _, _ := newEngine(t, passthroughBundle(t))
	for _, tc := range []struct {
		doc  string
		want nvmegate.Obligations
	}{
		{`{}`, nvmegate.Obligations{}},
		{`{"max_ttl": "1h30m", "require_tls": true, "auth_mode": "both", "min_hash": "sha384",
		   "min_dh_group": "ffdhe3072", "bidirectional": true, "read_only": true, "max_iops": 50000, "max_mbps": 1200}`,
			nvmegate.Obligations{MaxTTL: 90 * time.Minute, RequireTLS: true, AuthMode: "both", MinHash: "sha384",
				MinDHGroup: "ffdhe3072", Bidirectional: true, ReadOnly: true, MaxIOPS: 50000, MaxMBps: 1200}},
		{`{"auth_mode": "dhchap", "min_dh_group": "null", "max_iops": 0, "require_tls": false}`,
			nvmegate.Obligations{AuthMode: "dhchap", MinDHGroup: "null"}},
		{`{"max_ttl": "15m", "auth_mode": "tls", "min_hash": "sha512", "max_mbps": 18446744073709551615}`,
			nvmegate.Obligations{MaxTTL: 15 * time.Minute, AuthMode: "tls", MinHash: "sha512", MaxMBps: 1<<64 - 1}},
	} {
		in := input("spiffe://example.org/admin/a", "/s.S/M")
		in.Resource = map[string]any{"decision": mustJSON(t, `{"allow": true, "reasons": ["ok"], "obligations": `+tc.doc+`}`)}
		d, err := e.Authorize(context.Background(), in)
		if err != nil || !d.Allow {
			t.Fatalf("%s: %+v, %v", tc.doc, d, err)
		}
		if d.Obligations != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.doc, d.Obligations, tc.want)
		}
	}
	// A deny carries no obligations.
	in := input("spiffe://example.org/admin/a", "/s.S/M")
	in.Resource = map[string]any{"decision": mustJSON(t, `{"allow": false, "reasons": ["no"], "obligations": {"read_only": true}}`)}
	if d, _ := e.Authorize(context.Background(), in); d.Allow || d.Obligations != (nvmegate.Obligations{}) {
		t.Errorf("deny: %+v", d)
	}
}

func mustJSON(t testing.TB, s string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

func TestEngineEvaluationError(t *testing.T) {
	// to_number fails on a non-numeric action; builtin errors are errors.
	b := bundle(t, map[string]string{"p.rego": `package nvmegate.authz
default allow := false
allow if to_number(input.action) > 0
decision := {"allow": allow, "reasons": ["r"], "obligations": {}}
`}, allowSample(`{"action": "1"}`), denySample(`{"action": "0"}`))
	e, _, log := newEngine(t, b)
	in := input("spiffe://example.org/admin/a", "/s.S/M")
	in.Action = "boom"
	d, err := e.Authorize(context.Background(), in)
	if !errors.Is(err, authz.ErrEvaluation) {
		t.Fatalf("err = %v, want ErrEvaluation", err)
	}
	if d == nil || d.Allow || !slices.Equal(d.Reasons, []string{authz.ReasonEvaluationFailed}) || d.ID == "" {
		t.Errorf("decision %+v", d)
	}
	if !strings.Contains(log.String(), "policy evaluation failed") || !strings.Contains(log.String(), d.ID) {
		t.Errorf("log does not name the failed decision:\n%s", log)
	}

	// An input the engine cannot convert.
	in.Action = "1"
	in.Resource = map[string]any{"ch": make(chan int)}
	d, err = e.Authorize(context.Background(), in)
	if !errors.Is(err, authz.ErrEvaluation) || d.Allow || d.Reasons[0] != authz.ReasonInputFailed {
		t.Errorf("unconvertible input: %+v, %v", d, err)
	}

	// A canceled context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	in.Resource = nil
	d, err = e.Authorize(ctx, in)
	if !errors.Is(err, context.Canceled) || d.Allow || d.Reasons[0] != authz.ReasonCanceled {
		t.Errorf("canceled: %+v, %v", d, err)
	}
}

func TestEngineNetworkBuiltinsRefused(t *testing.T) {
	b := bundle(t, map[string]string{"p.rego": `package nvmegate.authz
r := http.send({"method": "GET", "url": "http://127.0.0.1:1/"})
decision := {"allow": r.status_code == 200, "reasons": ["r"], "obligations": {}}
`}, allowSample(`{}`), denySample(`{"x": 1}`))
	_, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: b})
	if !errors.Is(err, authz.ErrCompile) || !strings.Contains(err.Error(), "http.send") {
		t.Errorf("err = %v, want ErrCompile naming http.send", err)
	}
}

// brokenBundles are policies NewEngine and Reload must refuse: the embedded
// bundle with one file changed.
func brokenBundles(t testing.TB) map[string]struct {
	b    *policy.Bundle
	want error
	msg  string
} {
	embedded, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	authzRego := string(mustRead(t, embedded.FS(), "authz.rego"))
	dataJSON := string(mustRead(t, embedded.FS(), "data.json"))
	selftest := string(mustRead(t, embedded.FS(), "selftest.json"))
	with := func(name, content string) *policy.Bundle {
		t.Helper()
		fsys := copyFS(t, embedded)
		fsys[name] = &fstest.MapFile{Data: []byte(content)}
		b, err := policy.Load(fsys)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	replace := func(src, old, new string) string {
		t.Helper()
		if !strings.Contains(src, old) {
			t.Fatalf("broken bundle: %q not found", old)
		}
		return strings.Replace(src, old, new, 1)
	}
	type broken = struct {
		b    *policy.Bundle
		want error
		msg  string
	}
	return map[string]broken{
		"syntax error":                  {with("authz.rego", authzRego+"\nallow if {"), authz.ErrCompile, "rego_parse_error"},
		"strict mode (unused variable)": {with("authz.rego", authzRego+"\nx if { y := 1 }\n"), authz.ErrCompile, "assigned var y unused"},
		"type error":                    {with("authz.rego", authzRego+"\nx := count(1)\n"), authz.ErrCompile, "rego_type_error"},
		"rego v0 syntax": {with("authz.rego", "package nvmegate.authz\ndecision = {\"allow\": true, \"reasons\": [], \"obligations\": {}} { true }\n"),
			authz.ErrCompile, "rego_parse_error"},
		"decision undefined (renamed)": {with("authz.rego", replace(authzRego, "decision := {", "decisions := {")),
			authz.ErrSelfTest, "decision is undefined"},
		"allow-all": {with("authz.rego", replace(authzRego, `} else := {"allow": false, "reasons": deny_reasons, "obligations": {}}`, `} else := {"allow": true, "reasons": deny_reasons, "obligations": {}}`)),
			authz.ErrSelfTest, "got allow=true, want allow=false"},
		// The node's job scope still applies: no job, no inventory.
		"data that grants nodes the inventory": {with("data.json", replace(dataJSON, `"actions": ["access.discover",`, `"actions": ["inventory.*", "access.discover",`)),
			authz.ErrSelfTest, `"node may not add a target": got other reasons`},
		"data that drops the residency fence": {with("data.json", replace(dataJSON, `"eu-west":    {"target_regions": ["eu-west", "eu-central"]},`, `"eu-west":    {"target_regions": ["eu-west", "eu-central", "us-east"]},`)),
			authz.ErrSelfTest, `"node may not connect where the target breaks residency": got allow=true`},
		"data that the data checks refuse": {with("data.json", replace(dataJSON, `"internal": {"max_ttl": "24h"}`, `"internal": {"max_ttl": "1 day"}`)),
			authz.ErrData, "class internal: max_ttl has an invalid value 1 day"},
		"data with a reserved key": {with("nvmegate/derived/data.json", `{}`),
			authz.ErrData, "nvmegate.derived is reserved"},
		"reason text changed": {with("authz.rego", replace(authzRego, "no rule allows role", "no rule lets role")),
			authz.ErrSelfTest, "got other reasons"},
		"malformed obligations": {with("authz.rego", replace(authzRego, `"obligations": fast[1]}`, `"obligations": object.union(fast[1], {"mystery": true})}`)),
			authz.ErrSelfTest, `unknown obligation "mystery"`},
		"sample input with an unknown field": {with("selftest.json", replace(selftest, `{"samples": [`, `{"samples": [{"name": "typo", "input": {"caler": {}}, "allow": false},`)),
			authz.ErrSelfTest, "not an input document"},
		"sample evaluation error": {with("authz.rego", authzRego+"\nproblems contains \"boom\" if to_number(input.action) > 0\n"),
			authz.ErrSelfTest, "evaluation failed"},
	}
}

func mustRead(t testing.TB, fsys fs.FS, name string) []byte {
	t.Helper()
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestNewEngineRefusesBrokenPolicy(t *testing.T) {
	for name, tc := range brokenBundles(t) {
		t.Run(name, func(t *testing.T) {
			e, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: tc.b})
			if e != nil || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("NewEngine = %v, %v; want %v containing %q", e, err, tc.want, tc.msg)
			}
			if errors.Is(tc.want, authz.ErrSelfTest) {
				var ste *authz.SelfTestError
				if !errors.As(err, &ste) || ste.Sample == "" || ste.Revision != tc.b.Revision {
					t.Errorf("not a SelfTestError naming the sample: %#v", err)
				}
			}
		})
	}
}

func TestReload(t *testing.T) {
	e, clk, log := newEngine(t, nil)
	st := e.Status()
	if st.Source != authz.SourceEmbedded || !st.LoadedAt.Equal(epoch) || !strings.HasPrefix(st.Revision, "sha256:") {
		t.Fatalf("status %+v", st)
	}
	embedded, _ := policy.Load(policy.Default())
	if st.Revision != embedded.Revision {
		t.Fatalf("revision %s, embedded bundle has %s", st.Revision, embedded.Revision)
	}
	nodeAdd := input("spiffe://example.org/node/gpu-01", "/nvmegate.v1.Inventory/AddTarget")
	adminAdd := input("spiffe://example.org/admin/alice", "/nvmegate.v1.Inventory/AddTarget")

	// Broken candidates are refused; the old revision keeps answering.
	for name, tc := range brokenBundles(t) {
		clk.Add(time.Minute)
		if err := e.Reload(context.Background(), tc.b, "test:"+name); !errors.Is(err, tc.want) {
			t.Errorf("%s: Reload = %v, want %v", name, err, tc.want)
		}
		if !reflect.DeepEqual(e.Status(), st) {
			t.Fatalf("%s: status changed to %+v", name, e.Status())
		}
		d, err := e.Authorize(context.Background(), adminAdd)
		if err != nil || !d.Allow || d.PolicyRevision != st.Revision {
			t.Fatalf("%s: old revision stopped answering: %+v, %v", name, d, err)
		}
	}
	if !strings.Contains(log.String(), "policy refused") {
		t.Error("refusals not logged")
	}
	if err := e.Reload(context.Background(), nil, "x"); !errors.Is(err, authz.ErrConfig) {
		t.Errorf("nil bundle: %v", err)
	}

	// A good candidate, with data that lets auditors read targets and a
	// sample that says so, replaces it, with a new revision.
	fsys := copyFS(t, embedded)
	dataJSON := strings.Replace(string(mustRead(t, fsys, "data.json")), `"actions": ["audit.query",`, `"actions": ["inventory.get_target", "audit.query",`, 1)
	fsys["data.json"] = &fstest.MapFile{Data: []byte(dataJSON)}
	selftest := strings.Replace(string(mustRead(t, fsys, "selftest.json")), `{"samples": [`, `{"samples": [{"name": "auditor may read a target",
		"input": {"caller": {"id": "spiffe://example.org/auditor/eve", "trust_domain": "example.org", "role": "auditor"},
		"rpc": {"service": "nvmegate.v1.Inventory", "method": "GetTarget"}, "action": "inventory.get_target", "resource": {},
		"gateway": {"trust_domain": "example.org"}}, "allow": true},`, 1)
	fsys["selftest.json"] = &fstest.MapFile{Data: []byte(selftest)}
	nb, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if nb.Revision == st.Revision {
		t.Fatal("revision did not change with content")
	}
	clk.Add(time.Hour)
	if err := e.Reload(context.Background(), nb, "/etc/nvmegate/policy"); err != nil {
		t.Fatal(err)
	}
	if got := e.Status(); got.Revision != nb.Revision || got.Source != "/etc/nvmegate/policy" || !got.LoadedAt.Equal(clk.Now()) {
		t.Errorf("status after reload %+v", got)
	}
	d, err := e.Authorize(context.Background(), input("spiffe://example.org/auditor/eve", "/nvmegate.v1.Inventory/GetTarget"))
	if err != nil || !d.Allow || d.PolicyRevision != nb.Revision || !slices.Equal(d.Reasons, []string{"role auditor may perform inventory.get_target"}) {
		t.Errorf("after reload: %+v, %v", d, err)
	}
	d, _ = e.Authorize(context.Background(), input("spiffe://example.org/auditor/eve", "/nvmegate.v1.Inventory/RemoveTarget"))
	if d.Allow {
		t.Error("action list not honoured")
	}
	_ = nodeAdd
}

// TestReloadConcurrent swaps revisions while requests are decided: every
// decision names a revision that was serving and is consistent with it.
func TestReloadConcurrent(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	embedded, _ := policy.Load(policy.Default())
	fsys := copyFS(t, embedded)
	fsys["authz.rego"] = &fstest.MapFile{Data: append(mustRead(t, fsys, "authz.rego"), "\n# another revision\n"...)}
	other, err := policy.Load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	revs := map[string]bool{embedded.Revision: true, other.Revision: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			b := embedded
			if i%2 == 0 {
				b = other
			}
			if err := e.Reload(ctx, b, "x"); err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}
	}()
	in := input("spiffe://example.org/admin/alice", "/nvmegate.v1.Inventory/AddTarget")
	for range 200 {
		d, err := e.Authorize(context.Background(), in)
		if err != nil || !d.Allow || !revs[d.PolicyRevision] {
			t.Fatalf("%+v, %v", d, err)
		}
	}
	cancel()
	wg.Wait()
}

func TestNewEngineOptions(t *testing.T) {
	if _, err := authz.NewEngine(context.Background(), authz.Options{}); !errors.Is(err, authz.ErrConfig) {
		t.Errorf("no trust domain: %v", err)
	}
	// Defaults: embedded bundle, real clock, no logger.
	e, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	d, err := e.Authorize(context.Background(), input("spiffe://example.org/node/n", "/grpc.health.v1.Health/Check"))
	if err != nil || !d.Allow || d.EvaluatedAt.Before(before) {
		t.Errorf("%+v, %v", d, err)
	}
	// A hand-built bundle without samples cannot pass a self-test.
	nb := passthroughBundle(t)
	nb.Samples = nil
	if _, err := authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: nb}); !errors.Is(err, authz.ErrSelfTest) {
		t.Errorf("no samples: %v", err)
	}
	// A custom bundle without a source.
	e, err = authz.NewEngine(context.Background(), authz.Options{TrustDomain: td, Bundle: passthroughBundle(t)})
	if err != nil || e.Status().Source != "unspecified" {
		t.Errorf("%v, %+v", err, e.Status())
	}
}

func TestDecisionIDs(t *testing.T) {
	e, clk, _ := newEngine(t, nil)
	in := input("spiffe://example.org/node/n", "/grpc.health.v1.Health/Check")
	seen := map[string]bool{}
	var prev string
	for range 1000 {
		clk.Add(time.Millisecond)
		d, _ := e.Authorize(context.Background(), in)
		if seen[d.ID] || !uuid7RE.MatchString(d.ID) {
			t.Fatalf("ID %q repeated or malformed", d.ID)
		}
		if d.ID <= prev {
			t.Fatalf("IDs not time-ordered: %s after %s", d.ID, prev)
		}
		seen[d.ID], prev = true, d.ID
	}
	// The time in the ID is the engine's clock.
	d, _ := e.Authorize(context.Background(), in)
	ms := clk.Now().UnixMilli()
	if got, want := strings.ReplaceAll(d.ID, "-", "")[:12], fmt.Sprintf("%012x", ms); got != want {
		t.Errorf("ID %s does not start with the clock's milliseconds %s", d.ID, want)
	}
}

// A held engine decides nothing: every call is denied and fails with
// ErrHeld, saying why, until a policy loads again.
func TestEngineHold(t *testing.T) {
	e, _, _ := newEngine(t, nil)
	in := input("spiffe://example.org/admin/alice", "/nvmegate.v1.Inventory/AddTarget")
	if d, err := e.Authorize(context.Background(), in); err != nil || !d.Allow {
		t.Fatalf("before the hold: %+v %v", d, err)
	}
	e.Hold(errors.New("the policy in force does not compile here"))
	d, err := e.Authorize(context.Background(), in)
	if !errors.Is(err, authz.ErrHeld) || d == nil || d.Allow || !strings.Contains(strings.Join(d.Reasons, ";"), "does not compile here") {
		t.Fatalf("held: %+v %v", d, err)
	}
	b, err := policy.Load(policy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(context.Background(), b, "test"); err != nil {
		t.Fatal(err)
	}
	if d, err := e.Authorize(context.Background(), in); err != nil || !d.Allow {
		t.Fatalf("after a reload: %+v %v", d, err)
	}
}
