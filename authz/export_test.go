package authz

import "fmt"

// ScopeFromResource is scopeFromResource, for the tests of package authz_test.
var ScopeFromResource = scopeFromResource

// scopeFromResource is the typed scope of a well-formed connect resource
// built as the gateway builds it (gateway/describe.go), or nil (and why)
// for one a typed scope cannot describe (a garbled record).
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
	keys := func(m map[string]any, allowed ...string) {
		for k := range m {
			ok := false
			for _, a := range allowed {
				ok = ok || k == a
			}
			if !ok {
				panic("unknown key " + k)
			}
		}
	}
	s = &Scope{Tenant: str(res, "tenant"), RequestMode: str(res["request"].(map[string]any), "mode")}
	job := res["job"].(map[string]any)
	s.Job = ScopeJob{ID: str(job, "job_id")}
	if _, ok := job["tenant"]; ok {
		s.Job.Found, s.Job.Tenant = true, str(job, "tenant")
		for _, r := range job["allowed_regions"].([]any) {
			s.Job.AllowedRegions = append(s.Job.AllowedRegions, r.(string))
		}
	}
	sub := res["subsystem"].(map[string]any)
	keys(sub, "nqn", "tenant", "target_id", "dhchap", "tls")
	s.Subsystem = ScopeSubsystem{NQN: str(sub, "nqn")}
	if _, ok := sub["tenant"]; ok {
		s.Subsystem = ScopeSubsystem{NQN: str(sub, "nqn"), Found: true, Tenant: str(sub, "tenant"), TargetID: str(sub, "target_id"),
			DHCHAP: sub["dhchap"].(bool), TLS: sub["tls"].(bool)}
	}
	if t, ok := res["target"].(map[string]any); ok {
		keys(t, "id", "region", "fabric", "driver")
		s.Target = &ScopeTarget{ID: str(t, "id"), Region: str(t, "region"), Fabric: str(t, "fabric"), Driver: str(t, "driver")}
	}
	for _, x := range res["namespaces"].([]any) {
		m := x.(map[string]any)
		ns := ScopeNamespace{SubsystemNQN: str(m, "subsystem_nqn"), NSID: uint32(num(m["nsid"])), Mode: str(m, "mode")}
		if _, ok := m["tenant"]; ok {
			keys(m, "subsystem_nqn", "nsid", "tenant", "region", "data_class", "dataset", "qos", "mode", "target")
			ds, qos := m["dataset"].(map[string]any), m["qos"].(map[string]any)
			ns.Found, ns.Tenant, ns.Region, ns.DataClass = true, str(m, "tenant"), str(m, "region"), str(m, "data_class")
			ns.DatasetName, ns.DatasetDigest = str(ds, "name"), str(ds, "digest")
			ns.MaxIOPS, ns.MaxMBps = num(qos["max_iops"]), num(qos["max_mbps"])
			if t, ok := m["target"].(map[string]any); ok {
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
