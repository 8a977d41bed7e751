package authz

import (
	"encoding/binary"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Scope is the scope of a connect or renew, typed: the records the scope
// decision reads (policy/connect.rego, scope_input), as the gateway
// describes them in Input.Resource (policy/README.md). When Input.Scope is
// set and the action is one the policy decides in parts, the engine takes
// the scope decision's input from it and ignores Resource's namespaces and
// subsystem (Resource still holds the caller's records: the job, the
// binding, the request, and the tenant and target). A typed scope is
// hashed and converted without walking maps, which on a node's every
// connect is most of what the engine would spend outside OPA (see
// BenchmarkConnect). It must describe the same records as Resource; for
// other actions it is ignored.
type Scope struct {
	Tenant      string           // resource.tenant
	Job         ScopeJob         // resource.job, narrowed to what the scope reads
	Subsystem   ScopeSubsystem   // resource.subsystem
	Target      *ScopeTarget     // resource.target; nil if absent
	Namespaces  []ScopeNamespace // resource.namespaces, in order
	RequestMode string           // resource.request.mode
}

// ScopeJob is the job of a scope: {job_id, tenant, allowed_regions}, or
// {job_id} alone for a job the gateway did not find.
type ScopeJob struct {
	ID             string
	Found          bool
	Tenant         string
	AllowedRegions []string
}

// ScopeSubsystem is {nqn, tenant, target_id, dhchap, tls}, or {nqn} alone
// for a subsystem the gateway did not find.
type ScopeSubsystem struct {
	NQN         string
	Found       bool
	Tenant      string
	TargetID    string
	DHCHAP, TLS bool
}

// ScopeTarget is {id, region, fabric, driver}.
type ScopeTarget struct {
	ID, Region, Fabric, Driver string
}

// ScopeNamespace is one namespace: {subsystem_nqn, nsid, tenant, region,
// data_class, dataset: {name, digest}, qos: {max_iops, max_mbps}, mode,
// target: {id, region, fabric}}; {subsystem_nqn, nsid, mode} alone for one
// the gateway did not find (Found false), and without target for one whose
// subsystem or target it did not find (Placed false).
type ScopeNamespace struct {
	SubsystemNQN  string
	NSID          uint32
	Mode          string
	Found         bool
	Tenant        string
	Region        string
	DataClass     string
	DatasetName   string
	DatasetDigest string
	MaxIOPS       uint64
	MaxMBps       uint64
	Placed        bool
	Target        ScopePlacement
}

// ScopePlacement is the target a namespace's data is on: {id, region, fabric}.
type ScopePlacement struct {
	ID, Region, Fabric string
}

// tTyped starts the key of a typed scope; a map's starts with the action
// (a tString), so the two never meet.
const tTyped = 'T'

// typedScope writes the scope input of s: every field in a fixed order,
// with presence flags where a record may be partial.
func (c *canon) typedScope(action string, s *Scope) {
	flag := func(b bool) {
		if b {
			c.tag(tTrue)
		} else {
			c.tag(tFalse)
		}
	}
	u := func(n uint64) { c.b = binary.AppendUvarint(c.b, n) }
	c.tag(tTyped)
	c.str(action)
	c.str(s.Tenant)
	c.str(s.Job.ID)
	flag(s.Job.Found)
	if s.Job.Found {
		c.str(s.Job.Tenant)
		u(uint64(len(s.Job.AllowedRegions)))
		for _, r := range s.Job.AllowedRegions {
			c.str(r)
		}
	}
	c.str(s.Subsystem.NQN)
	flag(s.Subsystem.Found)
	if s.Subsystem.Found {
		c.str(s.Subsystem.Tenant)
		c.str(s.Subsystem.TargetID)
		flag(s.Subsystem.DHCHAP)
		flag(s.Subsystem.TLS)
	}
	flag(s.Target != nil)
	if t := s.Target; t != nil {
		c.str(t.ID)
		c.str(t.Region)
		c.str(t.Fabric)
		c.str(t.Driver)
	}
	u(uint64(len(s.Namespaces)))
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		c.str(ns.SubsystemNQN)
		u(uint64(ns.NSID))
		c.str(ns.Mode)
		flag(ns.Found)
		if !ns.Found {
			continue
		}
		c.str(ns.Tenant)
		c.str(ns.Region)
		c.str(ns.DataClass)
		c.str(ns.DatasetName)
		c.str(ns.DatasetDigest)
		u(ns.MaxIOPS)
		u(ns.MaxMBps)
		flag(ns.Placed)
		if ns.Placed {
			c.str(ns.Target.ID)
			c.str(ns.Target.Region)
			c.str(ns.Target.Fabric)
		}
	}
	c.str(s.RequestMode)
}

// typedScopeValue is the scope input of s as an OPA value: the document
// scopeInputValue makes of the resource s describes.
func typedScopeValue(action string, s *Scope) ast.Value {
	tc := termCache{}
	obj := func(kv ...any) *ast.Term {
		items := make([][2]*ast.Term, 0, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			items = append(items, [2]*ast.Term{tc.str(kv[i].(string)), kv[i+1].(*ast.Term)})
		}
		return ast.NewTerm(ast.NewObject(items...))
	}
	str := tc.str
	num := func(n uint64) *ast.Term { return ast.NewTerm(ast.Number(strconv.FormatUint(n, 10))) }

	job := obj("job_id", str(s.Job.ID))
	if s.Job.Found {
		regions := make([]*ast.Term, len(s.Job.AllowedRegions))
		for i, r := range s.Job.AllowedRegions {
			regions[i] = str(r)
		}
		job = obj("job_id", str(s.Job.ID), "tenant", str(s.Job.Tenant), "allowed_regions", ast.ArrayTerm(regions...))
	}
	sub := obj("nqn", str(s.Subsystem.NQN))
	if ss := &s.Subsystem; ss.Found {
		sub = obj("nqn", str(ss.NQN), "tenant", str(ss.Tenant), "target_id", str(ss.TargetID),
			"dhchap", ast.BooleanTerm(ss.DHCHAP), "tls", ast.BooleanTerm(ss.TLS))
	}
	nss := make([]*ast.Term, len(s.Namespaces))
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		if !ns.Found {
			nss[i] = obj("subsystem_nqn", str(ns.SubsystemNQN), "nsid", num(uint64(ns.NSID)), "mode", str(ns.Mode))
			continue
		}
		kv := []any{
			"subsystem_nqn", str(ns.SubsystemNQN), "nsid", num(uint64(ns.NSID)), "tenant", str(ns.Tenant),
			"region", str(ns.Region), "data_class", str(ns.DataClass), "mode", str(ns.Mode),
			"dataset", obj("name", str(ns.DatasetName), "digest", str(ns.DatasetDigest)),
			"qos", obj("max_iops", num(ns.MaxIOPS), "max_mbps", num(ns.MaxMBps)),
		}
		if ns.Placed {
			kv = append(kv, "target", obj("id", str(ns.Target.ID), "region", str(ns.Target.Region), "fabric", str(ns.Target.Fabric)))
		}
		nss[i] = obj(kv...)
	}
	res := []any{
		"tenant", str(s.Tenant), "job", job, "subsystem", sub,
		"namespaces", ast.ArrayTerm(nss...), "request", obj("mode", str(s.RequestMode)),
	}
	if t := s.Target; t != nil {
		res = append(res, "target", obj("id", str(t.ID), "region", str(t.Region), "fabric", str(t.Fabric), "driver", str(t.Driver)))
	}
	return ast.NewObject(ast.Item(kAction, ast.StringTerm(action)), ast.Item(kResource, obj(res...)))
}
