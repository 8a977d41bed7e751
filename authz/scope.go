package authz

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Scope is the resource of a connect or renew, typed: every record the
// gateway describes for a node's call to a subsystem in a job (gateway
// scopeResource; policy/README.md), so that input.resource need not be
// built as a map. When Input.Scope is set the engine reads the resource
// from it alone and ignores Input.Resource: for an action the policy
// decides in parts, the scope decision's input (the scope's records) and
// the caller decision's (the caller's: the job, the binding, the request)
// are hashed and converted from it without walking maps, which on a node's
// every connect is most of what the engine would spend outside OPA (see
// BenchmarkConnect); for any other decision (DecisionQuery) it is
// converted to input.resource directly. ResourceMap gives the map it
// describes to whoever needs one (an audit entry).
//
// A Scope describes a subsystem call: its resource always has a subsystem,
// a job, a binding and a request with a TTL. The document it makes of each
// record is the gateway's, key for key and type for type; a field that
// record does not have is not in it.
type Scope struct {
	Kind      string         // resource.kind ("job" as the gateway describes a node's call)
	Tenant    string         // resource.tenant
	Job       ScopeJob       // resource.job
	Binding   ScopeBinding   // resource.host_binding
	Request   ScopeRequest   // resource.request
	Subsystem ScopeSubsystem // resource.subsystem
	Target    *ScopeTarget   // resource.target; nil if absent
	// Ports are resource.ports, the subsystem's ports with the subnets
	// they serve (the fabric segmentation the caller's part checks): set
	// with Target; nil (absent) without it.
	Ports      []ScopePort
	Namespaces []ScopeNamespace // resource.namespaces, in order

	// seal, if set, is the scope part's encoding made once (Sealed).
	seal *scopeSeal
}

// clone is a copy of s that shares no slice or pointer with it.
func (s *Scope) clone() Scope {
	out := *s
	out.Job.Nodes = slices.Clone(s.Job.Nodes)
	out.Job.AllowedRegions = slices.Clone(s.Job.AllowedRegions)
	out.Namespaces = slices.Clone(s.Namespaces)
	out.Ports = slices.Clone(s.Ports)
	out.Binding.Subnets = slices.Clone(s.Binding.Subnets)
	if s.Target != nil {
		t := *s.Target
		out.Target = &t
	}
	return out
}

// scopeSeal is what Sealed computed of a scope part: the SHA-256 of its
// canonical encoding (typedScope's, after the action).
type scopeSeal struct{ digest [32]byte }

// Sealed returns a copy of s whose scope part — every field the scope
// decision's input holds: Tenant, the job's ID, Found, Tenant and
// AllowedRegions, Subsystem, Target, Namespaces and Request.Mode — is
// encoded and hashed once, here, rather than on every decision: the memo
// keys of a sealed scope name its scope part by that digest. A caller that
// decides many calls on one job's scope (the gateway: every node of a job
// connecting to a subsystem, at one store revision) seals it once and
// gives each call a copy with the call's own caller fields (Kind, the
// job's Scheduler, Nodes, ExpiresAt and State, Binding, Request.HostNQN
// and TTL), which the seal does not cover. A copy keeps the seal, so the
// scope part of a sealed Scope and of its copies must never change; the
// copy Sealed returns shares no slice or pointer with s.
func (s *Scope) Sealed() *Scope {
	out := s.clone()
	c := getCanon()
	defer putCanon(c)
	c.scopePart(&out)
	out.seal = &scopeSeal{digest: sha256.Sum256(c.b)}
	return &out
}

// ScopeJob is the job: {job_id, tenant, scheduler, nodes, allowed_regions,
// expires_at, state}, or {job_id} alone for a job the gateway did not find
// (Found false). The scope decision reads job_id, tenant and
// allowed_regions; the caller decision all of it.
type ScopeJob struct {
	ID             string
	Found          bool
	Tenant         string
	Scheduler      string
	Nodes          []string // as policy sees them: the caller alone if it is a member, else none
	AllowedRegions []string
	ExpiresAt      time.Time // expires_at: its RFC 3339 form (nanoseconds, UTC)
	State          string
}

// ScopeBinding is the caller's host binding: {spiffe_id, host_nqn, tenant,
// bound, subnets}, every key but subnets always present (bound false for
// the default the gateway derives from the SPIFFE ID); subnets only if
// Subnets is not nil (the gateway always sets it: [] for a node without a
// fabric segment).
type ScopeBinding struct {
	SPIFFEID, HostNQN, Tenant string
	Bound                     bool
	Subnets                   []string
}

// ScopePort is one port of the subsystem: {id, subnet} (subnet "" for a
// port that serves none).
type ScopePort struct {
	ID     uint16
	Subnet string
}

// ScopeRequest is what the node asked for: {host_nqn, ttl, mode}.
type ScopeRequest struct {
	HostNQN, TTL, Mode string
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

// --- Memo keys ------------------------------------------------------------------
//
// The two typed encodings below continue the canonical encoding of canon.go:
// every string length-prefixed, every optional record behind a presence
// flag, every list behind its length, the fields in a fixed order. So the
// bytes determine every field the part's input holds, and a typed key
// cannot meet a map's (tTyped).

// tTyped starts the key of a typed scope; a map's starts with the action
// (a tString), so the two never meet. After the action, a sealed scope
// part is tSealed and its digest; an unsealed one starts with a tString.
const (
	tTyped  = 'T'
	tSealed = 'S'
)

func (c *canon) flag(b bool) {
	if b {
		c.tag(tTrue)
	} else {
		c.tag(tFalse)
	}
}

func (c *canon) uvarint(n uint64) { c.b = binary.AppendUvarint(c.b, n) }

func (c *canon) strs(ss []string) {
	c.uvarint(uint64(len(ss)))
	for _, s := range ss {
		c.str(s)
	}
}

// typedScope writes the scope input of s: every field it holds, in a
// fixed order, with presence flags where a record may be partial. It
// writes no field of the caller's (typedCaller does), so that every
// caller of a job shares its scope's key.
func (c *canon) typedScope(action string, s *Scope) {
	c.tag(tTyped)
	c.str(action)
	if s.seal != nil {
		c.tag(tSealed)
		c.b = append(c.b, s.seal.digest[:]...)
		return
	}
	c.scopePart(s)
}

// scopePart writes the scope part of s: typedScope's fields after the
// action.
func (c *canon) scopePart(s *Scope) {
	c.str(s.Tenant)
	c.str(s.Job.ID)
	c.flag(s.Job.Found)
	if s.Job.Found {
		c.str(s.Job.Tenant)
		c.strs(s.Job.AllowedRegions)
	}
	c.str(s.Subsystem.NQN)
	c.flag(s.Subsystem.Found)
	if s.Subsystem.Found {
		c.str(s.Subsystem.Tenant)
		c.str(s.Subsystem.TargetID)
		c.flag(s.Subsystem.DHCHAP)
		c.flag(s.Subsystem.TLS)
	}
	c.flag(s.Target != nil)
	if t := s.Target; t != nil {
		c.str(t.ID)
		c.str(t.Region)
		c.str(t.Fabric)
		c.str(t.Driver)
	}
	c.uvarint(uint64(len(s.Namespaces)))
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		c.str(ns.SubsystemNQN)
		c.uvarint(uint64(ns.NSID))
		c.str(ns.Mode)
		c.flag(ns.Found)
		if !ns.Found {
			continue
		}
		c.str(ns.Tenant)
		c.str(ns.Region)
		c.str(ns.DataClass)
		c.str(ns.DatasetName)
		c.str(ns.DatasetDigest)
		c.uvarint(ns.MaxIOPS)
		c.uvarint(ns.MaxMBps)
		c.flag(ns.Placed)
		if ns.Placed {
			c.str(ns.Target.ID)
			c.str(ns.Target.Region)
			c.str(ns.Target.Fabric)
		}
	}
	c.str(s.Request.Mode)
}

// typedCaller writes what the caller input holds beyond the scope input
// typedScope wrote before it: the caller, the RPC, the action, the gateway,
// and of the resource the kind, the job's other fields, the binding and
// the request's other fields (its tenant, target, job ID, tenant and
// regions and request mode are the scope's). The expiry is written as its
// instant, which determines its RFC 3339 form in UTC.
func (c *canon) typedCaller(in *Input, action string, gw Gateway, s *Scope) {
	c.identity(in, action, gw)
	c.str(s.Kind)
	if j := &s.Job; j.Found { // typedScope wrote Found
		c.str(j.Scheduler)
		c.strs(j.Nodes)
		c.b = binary.AppendVarint(c.b, j.ExpiresAt.Unix())
		c.uvarint(uint64(j.ExpiresAt.Nanosecond()))
		c.str(j.State)
	}
	b := &s.Binding
	c.str(b.SPIFFEID)
	c.str(b.HostNQN)
	c.str(b.Tenant)
	c.flag(b.Bound)
	c.flag(b.Subnets != nil)
	c.strs(b.Subnets)
	c.str(s.Request.HostNQN)
	c.str(s.Request.TTL)
	c.flag(s.Ports != nil)
	c.uvarint(uint64(len(s.Ports)))
	for _, p := range s.Ports {
		c.uvarint(uint64(p.ID))
		c.str(p.Subnet)
	}
}

// --- OPA values ---------------------------------------------------------------

// scopeTerms builds the records of a Scope as OPA terms, with one term per
// distinct string (termCache).
type scopeTerms struct{ tc termCache }

func newScopeTerms() scopeTerms { return scopeTerms{tc: termCache{}} }

// obj is an object of key-value pairs; keys are resource keys.
func (b scopeTerms) obj(kv ...*ast.Term) *ast.Term {
	items := make([][2]*ast.Term, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		items = append(items, [2]*ast.Term{kv[i], kv[i+1]})
	}
	return ast.NewTerm(ast.NewObject(items...))
}

func (b scopeTerms) s(s string) *ast.Term { return b.tc.str(s) }

func (b scopeTerms) strs(ss []string) *ast.Term {
	ts := make([]*ast.Term, len(ss))
	for i, s := range ss {
		ts[i] = b.tc.str(s)
	}
	return ast.ArrayTerm(ts...)
}

func num(n uint64) *ast.Term { return ast.NewTerm(ast.Number(strconv.FormatUint(n, 10))) }

// job is the job: the whole record, or for the scope input (narrow) its
// job_id, tenant and allowed_regions.
func (b scopeTerms) job(j *ScopeJob, narrow bool) *ast.Term {
	s := b.s
	switch {
	case !j.Found:
		return b.obj(s("job_id"), s(j.ID))
	case narrow:
		return b.obj(s("job_id"), s(j.ID), s("tenant"), s(j.Tenant), s("allowed_regions"), b.strs(j.AllowedRegions))
	}
	return b.obj(s("job_id"), s(j.ID), s("tenant"), s(j.Tenant), s("scheduler"), s(j.Scheduler),
		s("nodes"), b.strs(j.Nodes), s("allowed_regions"), b.strs(j.AllowedRegions),
		s("expires_at"), ast.StringTerm(expiresAt(j.ExpiresAt)), s("state"), s(j.State))
}

// expiresAt is a job's expires_at: its expiry in RFC 3339 with
// nanoseconds, in UTC (as the gateway describes jobs).
func expiresAt(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func (b scopeTerms) binding(x *ScopeBinding) *ast.Term {
	s := b.s
	kv := []*ast.Term{s("spiffe_id"), s(x.SPIFFEID), s("host_nqn"), s(x.HostNQN), s("tenant"), s(x.Tenant), s("bound"), ast.BooleanTerm(x.Bound)}
	if x.Subnets != nil {
		kv = append(kv, s("subnets"), b.strs(x.Subnets))
	}
	return b.obj(kv...)
}

// ports are the subsystem's ports: [{id, subnet}].
func (b scopeTerms) ports(ps []ScopePort) *ast.Term {
	s := b.s
	ts := make([]*ast.Term, len(ps))
	for i, p := range ps {
		ts[i] = b.obj(s("id"), ast.InternedTerm(int(p.ID)), s("subnet"), s(p.Subnet))
	}
	return ast.ArrayTerm(ts...)
}

// request is the request: the whole record, or for the scope input
// (narrow) its mode.
func (b scopeTerms) request(r *ScopeRequest, narrow bool) *ast.Term {
	s := b.s
	if narrow {
		return b.obj(s("mode"), s(r.Mode))
	}
	return b.obj(s("host_nqn"), s(r.HostNQN), s("ttl"), s(r.TTL), s("mode"), s(r.Mode))
}

func (b scopeTerms) subsystem(x *ScopeSubsystem) *ast.Term {
	s := b.s
	if !x.Found {
		return b.obj(s("nqn"), s(x.NQN))
	}
	return b.obj(s("nqn"), s(x.NQN), s("tenant"), s(x.Tenant), s("target_id"), s(x.TargetID),
		s("dhchap"), ast.BooleanTerm(x.DHCHAP), s("tls"), ast.BooleanTerm(x.TLS))
}

func (b scopeTerms) target(t *ScopeTarget) *ast.Term {
	s := b.s
	return b.obj(s("id"), s(t.ID), s("region"), s(t.Region), s("fabric"), s(t.Fabric), s("driver"), s(t.Driver))
}

func (b scopeTerms) namespaces(nss []ScopeNamespace) *ast.Term {
	s := b.s
	ts := make([]*ast.Term, len(nss))
	for i := range nss {
		ns := &nss[i]
		if !ns.Found {
			ts[i] = b.obj(s("subsystem_nqn"), s(ns.SubsystemNQN), s("nsid"), num(uint64(ns.NSID)), s("mode"), s(ns.Mode))
			continue
		}
		kv := []*ast.Term{
			s("subsystem_nqn"), s(ns.SubsystemNQN), s("nsid"), num(uint64(ns.NSID)), s("tenant"), s(ns.Tenant),
			s("region"), s(ns.Region), s("data_class"), s(ns.DataClass), s("mode"), s(ns.Mode),
			s("dataset"), b.obj(s("name"), s(ns.DatasetName), s("digest"), s(ns.DatasetDigest)),
			s("qos"), b.obj(s("max_iops"), num(ns.MaxIOPS), s("max_mbps"), num(ns.MaxMBps)),
		}
		if ns.Placed {
			kv = append(kv, s("target"), b.obj(s("id"), s(ns.Target.ID), s("region"), s(ns.Target.Region), s("fabric"), s(ns.Target.Fabric)))
		}
		ts[i] = b.obj(kv...)
	}
	return ast.ArrayTerm(ts...)
}

// typedScopeValue is the scope input of s as an OPA value: the document
// scopeInputValue makes of the resource s describes.
func typedScopeValue(action string, s *Scope) ast.Value {
	b := newScopeTerms()
	kv := []*ast.Term{
		b.s("tenant"), b.s(s.Tenant), b.s("job"), b.job(&s.Job, true), b.s("subsystem"), b.subsystem(&s.Subsystem),
		b.s("namespaces"), b.namespaces(s.Namespaces), b.s("request"), b.request(&s.Request, true),
	}
	if s.Target != nil {
		kv = append(kv, b.s("target"), b.target(s.Target))
	}
	return ast.NewObject(ast.Item(kAction, ast.StringTerm(action)), ast.Item(kResource, b.obj(kv...)))
}

// typedCallerResource is the resource of the caller input of s: the
// document callerInputItems makes of the resource s describes (all of it
// but the namespaces and the subsystem).
func typedCallerResource(s *Scope) *ast.Term {
	b := newScopeTerms()
	return b.obj(b.callerRecords(s)...)
}

// callerRecords are the key-value pairs of the caller's part of s's
// resource.
func (b scopeTerms) callerRecords(s *Scope) []*ast.Term {
	kv := make([]*ast.Term, 0, 16)
	kv = append(kv, b.s("kind"), b.s(s.Kind), b.s("tenant"), b.s(s.Tenant), b.s("job"), b.job(&s.Job, false),
		b.s("host_binding"), b.binding(&s.Binding), b.s("request"), b.request(&s.Request, false))
	if s.Target != nil {
		kv = append(kv, b.s("target"), b.target(s.Target))
	}
	if s.Ports != nil {
		kv = append(kv, b.s("ports"), b.ports(s.Ports))
	}
	return kv
}

// typedResource is the whole resource s describes, as an OPA value: what
// the engine converts for a decision not made in parts.
func typedResource(s *Scope) ast.Value {
	b := newScopeTerms()
	kv := append(b.callerRecords(s), b.s("subsystem"), b.subsystem(&s.Subsystem), b.s("namespaces"), b.namespaces(s.Namespaces))
	return b.obj(kv...).Value
}

// --- The map ------------------------------------------------------------------

// ResourceMap is input.resource as a map: Resource if set, else the map
// Scope describes (built anew on each call), else nil. An Input whose
// resource is typed (the gateway's connects and renews) has no map until
// something that reads maps asks for one (an audit entry, an Authorizer
// other than the Engine); the decision does not need it.
func (in *Input) ResourceMap() map[string]any {
	if in.Resource != nil || in.Scope == nil {
		return in.Resource
	}
	return in.Scope.resourceMap()
}

// resourceMap is the resource s describes, with the Go types the gateway
// describes it with (gateway/describe.go: integers int64 and uint64, lists
// []any), so that what reads it sees the map it would have seen.
func (s *Scope) resourceMap() map[string]any {
	strs := func(ss []string) []any {
		out := make([]any, len(ss))
		for i, s := range ss {
			out[i] = s
		}
		return out
	}
	out := map[string]any{"kind": s.Kind, "tenant": s.Tenant}
	j := &s.Job
	out["job"] = map[string]any{"job_id": j.ID}
	if j.Found {
		out["job"] = map[string]any{
			"job_id": j.ID, "tenant": j.Tenant, "scheduler": j.Scheduler, "nodes": strs(j.Nodes),
			"allowed_regions": strs(j.AllowedRegions), "expires_at": expiresAt(j.ExpiresAt), "state": j.State,
		}
	}
	b := &s.Binding
	hb := map[string]any{"spiffe_id": b.SPIFFEID, "host_nqn": b.HostNQN, "tenant": b.Tenant, "bound": b.Bound}
	if b.Subnets != nil {
		hb["subnets"] = strs(b.Subnets)
	}
	out["host_binding"] = hb
	if s.Ports != nil {
		ps := make([]any, len(s.Ports))
		for i, p := range s.Ports {
			ps[i] = map[string]any{"id": int64(p.ID), "subnet": p.Subnet}
		}
		out["ports"] = ps
	}
	out["request"] = map[string]any{"host_nqn": s.Request.HostNQN, "ttl": s.Request.TTL, "mode": s.Request.Mode}
	sub := &s.Subsystem
	out["subsystem"] = map[string]any{"nqn": sub.NQN}
	if sub.Found {
		out["subsystem"] = map[string]any{"nqn": sub.NQN, "tenant": sub.Tenant, "target_id": sub.TargetID, "dhchap": sub.DHCHAP, "tls": sub.TLS}
	}
	if t := s.Target; t != nil {
		out["target"] = map[string]any{"id": t.ID, "region": t.Region, "fabric": t.Fabric, "driver": t.Driver}
	}
	nss := make([]any, len(s.Namespaces))
	for i := range s.Namespaces {
		ns := &s.Namespaces[i]
		if !ns.Found {
			nss[i] = map[string]any{"subsystem_nqn": ns.SubsystemNQN, "nsid": int64(ns.NSID), "mode": ns.Mode}
			continue
		}
		v := map[string]any{
			"subsystem_nqn": ns.SubsystemNQN, "nsid": int64(ns.NSID), "tenant": ns.Tenant, "region": ns.Region,
			"data_class": ns.DataClass, "mode": ns.Mode,
			"dataset": map[string]any{"name": ns.DatasetName, "digest": ns.DatasetDigest},
			"qos":     map[string]any{"max_iops": ns.MaxIOPS, "max_mbps": ns.MaxMBps},
		}
		if ns.Placed {
			v["target"] = map[string]any{"id": ns.Target.ID, "region": ns.Target.Region, "fabric": ns.Target.Fabric}
		}
		nss[i] = v
	}
	out["namespaces"] = nss
	return out
}
