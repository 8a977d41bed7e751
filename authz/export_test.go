package authz

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// ScopeFromResource is scopeFromResource, for the tests of package authz_test.
var ScopeFromResource = scopeFromResource

// scopeFromResource is the typed scope of a well-formed connect resource
// built as the gateway builds it (gateway/describe.go), or nil (and why)
// for one a typed scope cannot describe exactly (a garbled record, a key
// it does not have, an expiry not in its RFC 3339 form).
func scopeFromResource(res map[string]any) (s *Scope, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%v", r)
		}
	}()
	str := func(m map[string]any, k string) string {
		if _, ok := m[k]; !ok {
			panic("no " + k)
		}
		return m[k].(string)
	}
	num := func(x any) uint64 {
		switch v := x.(type) {
		case int:
			return uint64(v)
		case int64:
			return uint64(v)
		case uint64:
			return v
		}
		panic(fmt.Sprintf("%T is not a number", x))
	}
	strs := func(x any) []string {
		var out []string
		for _, e := range x.([]any) {
			out = append(out, e.(string))
		}
		return out
	}
	keys := func(m map[string]any, allowed ...string) {
		for k := range m {
			if !slices.Contains(allowed, k) {
				panic("unknown key " + k)
			}
		}
	}
	keys(res, "kind", "tenant", "job", "host_binding", "request", "subsystem", "target", "ports", "namespaces")
	req := res["request"].(map[string]any)
	keys(req, "host_nqn", "ttl", "mode")
	s = &Scope{Kind: str(res, "kind"), Tenant: str(res, "tenant"),
		Request: ScopeRequest{HostNQN: str(req, "host_nqn"), TTL: str(req, "ttl"), Mode: str(req, "mode")}}
	job := res["job"].(map[string]any)
	s.Job = ScopeJob{ID: str(job, "job_id")}
	if _, ok := job["tenant"]; ok {
		keys(job, "job_id", "tenant", "scheduler", "nodes", "allowed_regions", "expires_at", "state")
		exp, err := time.Parse(time.RFC3339Nano, str(job, "expires_at"))
		if err != nil || expiresAt(exp) != job["expires_at"] {
			panic(fmt.Sprintf("expires_at %q is not a time in its RFC 3339 form", job["expires_at"]))
		}
		s.Job = ScopeJob{ID: str(job, "job_id"), Found: true, Tenant: str(job, "tenant"), Scheduler: str(job, "scheduler"),
			Nodes: strs(job["nodes"]), AllowedRegions: strs(job["allowed_regions"]), ExpiresAt: exp, State: str(job, "state")}
	} else {
		keys(job, "job_id")
	}
	b := res["host_binding"].(map[string]any)
	keys(b, "spiffe_id", "host_nqn", "tenant", "bound", "subnets")
	s.Binding = ScopeBinding{SPIFFEID: str(b, "spiffe_id"), HostNQN: str(b, "host_nqn"), Tenant: str(b, "tenant"), Bound: b["bound"].(bool)}
	if sn, ok := b["subnets"]; ok {
		s.Binding.Subnets = append([]string{}, strs(sn)...)
	}
	if ps, ok := res["ports"]; ok {
		s.Ports = []ScopePort{}
		for _, x := range ps.([]any) {
			m := x.(map[string]any)
			keys(m, "id", "subnet")
			s.Ports = append(s.Ports, ScopePort{ID: uint16(num(m["id"])), Subnet: str(m, "subnet")})
		}
	}
	sub := res["subsystem"].(map[string]any)
	s.Subsystem = ScopeSubsystem{NQN: str(sub, "nqn")}
	if _, ok := sub["tenant"]; ok {
		keys(sub, "nqn", "tenant", "target_id", "dhchap", "tls")
		s.Subsystem = ScopeSubsystem{NQN: str(sub, "nqn"), Found: true, Tenant: str(sub, "tenant"), TargetID: str(sub, "target_id"),
			DHCHAP: sub["dhchap"].(bool), TLS: sub["tls"].(bool)}
	} else {
		keys(sub, "nqn")
	}
	if t, ok := res["target"]; ok {
		t := t.(map[string]any)
		keys(t, "id", "region", "fabric", "driver")
		s.Target = &ScopeTarget{ID: str(t, "id"), Region: str(t, "region"), Fabric: str(t, "fabric"), Driver: str(t, "driver")}
	}
	for _, x := range res["namespaces"].([]any) {
		m := x.(map[string]any)
		ns := ScopeNamespace{SubsystemNQN: str(m, "subsystem_nqn"), NSID: uint32(num(m["nsid"])), Mode: str(m, "mode")}
		if n := num(m["nsid"]); n > math.MaxUint32 {
			panic(fmt.Sprintf("nsid %d", n))
		}
		if _, ok := m["tenant"]; ok {
			keys(m, "subsystem_nqn", "nsid", "tenant", "region", "data_class", "dataset", "qos", "mode", "target")
			ds, qos := m["dataset"].(map[string]any), m["qos"].(map[string]any)
			keys(ds, "name", "digest")
			keys(qos, "max_iops", "max_mbps")
			ns.Found, ns.Tenant, ns.Region, ns.DataClass = true, str(m, "tenant"), str(m, "region"), str(m, "data_class")
			ns.DatasetName, ns.DatasetDigest = str(ds, "name"), str(ds, "digest")
			ns.MaxIOPS, ns.MaxMBps = num(qos["max_iops"]), num(qos["max_mbps"])
			if t, ok := m["target"]; ok {
				t := t.(map[string]any)
				keys(t, "id", "region", "fabric")
				ns.Placed, ns.Target = true, ScopePlacement{ID: str(t, "id"), Region: str(t, "region"), Fabric: str(t, "fabric")}
			}
		} else {
			keys(m, "subsystem_nqn", "nsid", "mode")
		}
		s.Namespaces = append(s.Namespaces, ns)
	}
	return s, nil
}

// SplitEvals is how many scope and caller decisions e's serving revision
// has evaluated (its memo misses).
func SplitEvals(e *Engine) (scopes, callers uint64) {
	s := e.current.Load().split
	return s.scopeEvals.Load(), s.callerEvals.Load()
}
