package gateway

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// describe tells policy what a request is about: the action derived from
// the RPC ("/nvmegate.v1.Inventory/AddTarget" → "inventory.add_target") and
// input.resource, built from STORED records wherever the request names one
// (the owning tenant of a subsystem comes from the store, not from the
// caller). Only what a request creates, or the filters it asks for, come
// from the request itself. The schema is policy/README.md's; requests
// arrive here validated.
//
// A record that does not exist is described by its key alone: policy then
// decides on what the caller may learn, and the handler answers NotFound to
// callers that were allowed. Any other store error fails the call closed.
func (s *Server) describe(ctx context.Context, fullMethod string, req any) (string, map[string]any, error) {
	d := &describer{ctx: ctx, store: s.store, jobs: s.jobs, members: &s.members, revisions: s.revisions}
	if s.lease != nil {
		d.grants = s.lease
	}
	if action, ok := targetAgentActions[fullMethod]; ok {
		// A target agent's calls are about its own target (its SVID's
		// name), whatever the request says; the stream's request is not
		// even read before policy decides.
		res, err := d.ownTarget()
		return action, res, err
	}
	res, err := d.resource(req)
	if err != nil {
		var ng *notCallersGrant
		if errors.As(err, &ng) {
			return "", nil, s.refuseGrant(ctx, fullMethod, ng)
		}
		// A domain error other than invalid input (a conflict, the store
		// unavailable) keeps its own status; authz answers the rest as
		// InvalidArgument.
		if c := nvmegate.ErrorCode(err); c != "" && c != nvmegate.EINVALID {
			return "", nil, toStatus(ctx, s.log, fullMethod, err)
		}
		s.recordInvalid(ctx, fullMethod, err)
		return "", nil, err
	}
	return authz.ActionFromMethod(fullMethod), res, nil
}

// targetAgentActions are the actions of the TargetAgent service, named as
// the role "target" lists them in the policy's data.
var targetAgentActions = map[string]string{
	"/nvmegate.v1.TargetAgent/Watch":       "target.watch",
	"/nvmegate.v1.TargetAgent/Ack":         "target.ack",
	"/nvmegate.v1.TargetAgent/Reencrypted": "target.reencrypted",
}

// ownTarget describes the caller's own target.
func (d *describer) ownTarget() (map[string]any, error) {
	id, _ := identity.PeerID(d.ctx)
	name := ""
	if c := authz.ParseCaller(id); c.Role == authz.RoleTarget {
		name = c.Name
	}
	return d.target(name)
}

type describer struct {
	ctx   context.Context
	store InventoryStore
	jobs  JobStore // nil: jobs are described by their ID only
	// grants reads the grant a renewal or release names (nil: the gateway
	// keeps no grants, and such a call is about none).
	grants interface {
		Grant(ctx context.Context, id string) (*nvmegate.Grant, error)
	}
	// members answers job membership (nil: scan the job's nodes).
	members *memberSets
	// revisions, if set, tells which store revision a scope was read at.
	revisions ScopeRevisions
	// caller, if set, is whose call is described (a re-decision of that
	// node's grant); otherwise the call's peer.
	caller string
	// Records read once per call: a connect's namespaces share their
	// subsystem and target.
	subs    map[string]*nvmegate.Subsystem
	targets map[string]*nvmegate.Target
}

// subsystemRec reads a subsystem once per call; nil if there is none.
func (d *describer) subsystemRec(nqn string) (*nvmegate.Subsystem, error) {
	if s, ok := d.subs[nqn]; ok {
		return s, nil
	}
	s, err := d.store.Subsystem(d.ctx, nqn)
	if ok, err := found(err); err != nil {
		return nil, err
	} else if !ok {
		s = nil
	}
	if d.subs == nil {
		d.subs = map[string]*nvmegate.Subsystem{}
	}
	d.subs[nqn] = s
	return s, nil
}

// targetRec reads a target once per call; nil if there is none.
func (d *describer) targetRec(id string) (*nvmegate.Target, error) {
	if t, ok := d.targets[id]; ok {
		return t, nil
	}
	t, err := d.store.Target(d.ctx, id)
	if ok, err := found(err); err != nil {
		return nil, err
	} else if !ok {
		t = nil
	}
	if d.targets == nil {
		d.targets = map[string]*nvmegate.Target{}
	}
	d.targets[id] = t
	return t, nil
}

// scopeKey keys the slot in a call's context where describe leaves the
// typed scope of a node's call for its handler (withScopeSlot, scopeFrom).
type scopeKey struct{}

type scopeSlot struct {
	scope *nvmegate.Scope
	// rev is the store's scope revision scope was read at, if it did not
	// move while describe read it (0: not known to be one revision).
	rev uint64
}

// withScopeSlot gives a call a slot for its scope; the interceptor chain
// adds it before policy, describe fills it.
func withScopeSlot(ctx context.Context) context.Context {
	return context.WithValue(ctx, scopeKey{}, &scopeSlot{})
}

// scopeFrom is the scope describe read for this call.
func scopeFrom(ctx context.Context) (*nvmegate.Scope, bool) {
	slot, _ := ctx.Value(scopeKey{}).(*scopeSlot)
	if slot == nil || slot.scope == nil {
		return nil, false
	}
	return slot.scope, true
}

// keepScope leaves sc for the call's handler (and policyScope); it
// reports whether the call has a slot for it.
func (d *describer) keepScope(sc *nvmegate.Scope) bool { return d.keepScopeAt(sc, 0) }

// keepScopeAt is keepScope for a scope read at store revision rev (0:
// unknown).
func (d *describer) keepScopeAt(sc *nvmegate.Scope, rev uint64) bool {
	slot, _ := d.ctx.Value(scopeKey{}).(*scopeSlot)
	if slot == nil {
		return false
	}
	slot.scope, slot.rev = sc, rev
	return true
}

func (d *describer) resource(req any) (map[string]any, error) {
	switch r := req.(type) {
	case *pb.AddTargetRequest:
		t := r.Target
		return res("target", "", "target", map[string]any{"id": t.GetId(), "region": t.GetRegion(), "fabric": t.GetFabric(), "driver": t.GetDriver()}), nil
	case *pb.GetTargetRequest:
		return d.target(r.Id)
	case *pb.RemoveTargetRequest:
		return d.target(r.Id)
	case *pb.ListTargetsRequest:
		return res("target", ""), nil

	case *pb.AddSubsystemRequest:
		sub := r.Subsystem
		out := res("subsystem", sub.GetTenant(), "subsystem", map[string]any{
			"nqn": sub.GetNqn(), "tenant": sub.GetTenant(), "target_id": sub.GetTargetId(), "dhchap": sub.GetDhchap(), "tls": sub.GetTls(),
		})
		return out, d.addTarget(out, sub.GetTargetId())
	case *pb.GetSubsystemRequest:
		return d.subsystem(r.Nqn)
	case *pb.RemoveSubsystemRequest:
		return d.subsystem(r.Nqn)
	case *pb.ListSubsystemsRequest:
		return res("subsystem", r.Tenant), nil

	case *pb.AddNamespaceRequest:
		n, err := namespaceFromProto(r.Namespace)
		if err != nil {
			return nil, err
		}
		out := res("namespace", n.Tenant)
		if err := d.addSubsystemOf(out, n.SubsystemNQN); err != nil {
			return nil, err
		}
		ns, err := d.namespaceValue(n, "")
		if err != nil {
			return nil, err
		}
		out["namespaces"] = []any{ns}
		return out, nil
	case *pb.GetNamespaceRequest:
		return d.namespace(r.SubsystemNqn, r.Nsid)
	case *pb.RemoveNamespaceRequest:
		return d.namespace(r.SubsystemNqn, r.Nsid)
	case *pb.ListNamespacesRequest:
		return res("namespace", r.Tenant), nil

	case *pb.AddHostBindingRequest:
		b := r.Binding
		return res("host_binding", b.GetTenant(), "host_binding", map[string]any{
			"spiffe_id": b.GetSpiffeId(), "host_nqn": b.GetHostNqn(), "tenant": b.GetTenant(), "bound": true,
		}), nil
	case *pb.GetHostBindingRequest:
		return d.binding(r.SpiffeId)
	case *pb.RemoveHostBindingRequest:
		return d.binding(r.SpiffeId)
	case *pb.ListHostBindingsRequest:
		return res("host_binding", r.Tenant), nil

	case *pb.AdmitRequest:
		return d.admit(r)
	case *pb.UpdateNodesRequest:
		return d.updateNodes(r)
	case *pb.JobsListRequest:
		return res("job", r.Tenant), nil
	case *pb.ListGrantsRequest:
		return res("grant", ""), nil
	case *pb.DiscoverRequest:
		return d.nodeCall(r.JobId)
	case *pb.RenewRequest:
		g, err := d.callersGrant(r.GrantId)
		if err != nil || g == nil {
			return res("grant", ""), err
		}
		ttl := ""
		if r.Ttl != nil {
			ttl = r.Ttl.AsDuration().String()
		}
		return d.subsystemCall(g.JobID, g.SubsystemNQN, g.HostNQN, ttl)
	case *pb.ReleaseRequest:
		g, err := d.callersGrant(r.GrantId)
		if err != nil || g == nil {
			return res("grant", ""), err
		}
		return d.nodeCall(g.JobID)
	case *pb.ConnectRequest:
		ttl := ""
		if r.Ttl != nil {
			ttl = r.Ttl.AsDuration().String()
		}
		return d.subsystemCall(r.JobId, r.SubsystemNqn, r.HostNqn, ttl)
	case interface{ GetJobId() string }:
		// Jobs.Get/Finish, Access.Discover/Connect, Audit.Lineage: the
		// stored job, whose tenant is the resource's. A job that does not
		// exist is described by its ID only, which policy refuses to every
		// tenant-scoped caller without saying whether it exists.
		return d.job(r.GetJobId())

	case *pb.RotateRequest:
		out, err := d.subsystemAs("key", r.SubsystemNqn)
		if err != nil {
			return nil, err
		}
		k := map[string]any{"class": "access_root"}
		if r.Kind == pb.KeyKind_KEY_KIND_DATA_KEY {
			k = map[string]any{"class": "data_key", "nsid": int64(r.Nsid)}
		}
		out["key"] = k
		return out, nil
	case *pb.KeysStatusRequest:
		if r.SubsystemNqn == "" {
			return res("key", ""), nil
		}
		return d.subsystemAs("key", r.SubsystemNqn)

	case *pb.QueryRequest:
		return res("audit", r.Tenant), nil
	case *pb.CheckpointRequest, *pb.InclusionProofRequest, *pb.ConsistencyProofRequest, *pb.ExportRequest:
		return res("audit", ""), nil
	case *pb.ExplainRequest, *pb.PolicyStatusRequest:
		return res("policy", ""), nil
	}
	return res("none", ""), nil
}

// res starts a resource of kind for tenant, with optional key/value pairs.
func res(kind, tenant string, kv ...any) map[string]any {
	m := map[string]any{"kind": kind, "tenant": tenant}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

func found(err error) (bool, error) {
	switch nvmegate.ErrorCode(err) {
	case "":
		return true, nil
	case nvmegate.ENOTFOUND:
		return false, nil
	}
	return false, err
}

func targetValue(t *nvmegate.Target) map[string]any {
	return map[string]any{"id": t.ID, "region": t.Region, "fabric": t.Fabric, "driver": t.Driver}
}

func subsystemValue(s *nvmegate.Subsystem) map[string]any {
	return map[string]any{"nqn": s.NQN, "tenant": s.Tenant, "target_id": s.TargetID, "dhchap": s.DHCHAP, "tls": s.TLS}
}

func (d *describer) target(id string) (map[string]any, error) {
	out := res("target", "")
	t, err := d.store.Target(d.ctx, id)
	if ok, err := found(err); err != nil {
		return nil, err
	} else if ok {
		out["target"] = targetValue(t)
	} else {
		out["target"] = map[string]any{"id": id}
	}
	return out, nil
}

// addTarget adds the stored target id to out, if it exists.
func (d *describer) addTarget(out map[string]any, id string) error {
	t, err := d.store.Target(d.ctx, id)
	if ok, err := found(err); err != nil {
		return err
	} else if ok {
		out["target"] = targetValue(t)
	}
	return nil
}

func (d *describer) subsystem(nqn string) (map[string]any, error) {
	return d.subsystemAs("subsystem", nqn)
}

// subsystemAs describes a request about subsystem nqn (or its keys): the
// stored subsystem's tenant is the resource's tenant.
func (d *describer) subsystemAs(kind, nqn string) (map[string]any, error) {
	out := res(kind, "")
	if err := d.addSubsystemOf(out, nqn); err != nil {
		return nil, err
	}
	if tenant, ok := out["subsystem"].(map[string]any)["tenant"].(string); ok {
		out["tenant"] = tenant
	}
	return out, nil
}

// addSubsystemOf adds the stored subsystem nqn and its target to out.
func (d *describer) addSubsystemOf(out map[string]any, nqn string) error {
	s, err := d.store.Subsystem(d.ctx, nqn)
	ok, err := found(err)
	if err != nil {
		return err
	}
	if !ok {
		out["subsystem"] = map[string]any{"nqn": nqn}
		return nil
	}
	out["subsystem"] = subsystemValue(s)
	return d.addTarget(out, s.TargetID)
}

func (d *describer) namespace(nqn string, nsid uint32) (map[string]any, error) {
	out := res("namespace", "")
	n, err := d.store.Namespace(d.ctx, nqn, nsid)
	ok, err := found(err)
	if err != nil {
		return nil, err
	}
	if !ok {
		out["namespaces"] = []any{map[string]any{"subsystem_nqn": nqn, "nsid": int64(nsid)}}
		return out, nil
	}
	out["tenant"] = n.Tenant
	ns, err := d.namespaceValue(n, "")
	if err != nil {
		return nil, err
	}
	out["namespaces"] = []any{ns}
	return out, d.addSubsystemOf(out, nqn)
}

// namespaceValue describes namespace n with the mode asked for and the
// target its data is on (through its stored subsystem).
func (d *describer) namespaceValue(n *nvmegate.Namespace, mode string) (map[string]any, error) {
	sn, err := d.scopeNamespace(n.Key(), n, mode)
	if err != nil {
		return nil, err
	}
	return namespaceValueAt(n, mode, sn.Target), nil
}

// namespaceValueAt describes namespace n with mode, on target t (nil if
// unknown).
func namespaceValueAt(n *nvmegate.Namespace, mode string, t *nvmegate.Target) map[string]any {
	v := map[string]any{
		"subsystem_nqn": n.SubsystemNQN, "nsid": int64(n.NSID), "tenant": n.Tenant, "region": n.Region,
		"data_class": n.DataClass, "mode": mode,
		"dataset": map[string]any{"name": n.Dataset.Name, "digest": n.Dataset.Digest},
		"qos":     map[string]any{"max_iops": n.QoS.MaxIOPS, "max_mbps": n.QoS.MaxMBps},
	}
	if t != nil {
		v["target"] = map[string]any{"id": t.ID, "region": t.Region, "fabric": t.Fabric}
	}
	return v
}

func (d *describer) binding(id string) (map[string]any, error) {
	out := res("host_binding", "")
	b, err := d.store.HostBinding(d.ctx, id)
	if ok, err := found(err); err != nil {
		return nil, err
	} else if ok {
		out["tenant"] = b.Tenant
		out["host_binding"] = bindingValue(b, true)
	} else {
		out["host_binding"] = map[string]any{"spiffe_id": id, "bound": false}
	}
	return out, nil
}

func bindingValue(b *nvmegate.HostBinding, bound bool) map[string]any {
	return map[string]any{"spiffe_id": b.SPIFFEID, "host_nqn": b.HostNQN, "tenant": b.Tenant, "bound": bound, "subnets": anySlice(subnetsOf(b))}
}

// nodeBinding is the binding of node id, or its derived default when it has
// none (bound false, no tenant).
func (d *describer) nodeBinding(id string) (map[string]any, error) {
	b, bound, err := d.nodeBindingRec(id)
	if err != nil {
		return nil, err
	}
	return bindingValue(&b, bound), nil
}

// nodeBindingRec is nodeBinding's record: the stored binding (bound), or
// the default derived from the SPIFFE ID.
func (d *describer) nodeBindingRec(id string) (nvmegate.HostBinding, bool, error) {
	b, err := d.store.HostBinding(d.ctx, id)
	ok, err := found(err)
	if err != nil {
		return nvmegate.HostBinding{}, false, err
	}
	if ok {
		return *b, true, nil
	}
	nqn, err := nvmefmt.HostNQNFromSPIFFEID(id)
	if err != nil {
		return nvmegate.HostBinding{}, false, nvmegate.Invalid("nodes", "%v", err)
	}
	// The derived default must not be a host NQN an explicit binding gave
	// to another identity (compared canonically): that node's targets
	// would accept this one. A binding made after this read is caught by
	// the grant's commit (store.PutGrants), which checks again.
	other, err := d.store.HostBindingByNQN(d.ctx, nqn)
	switch ok, err := found(err); {
	case err != nil:
		return nvmegate.HostBinding{}, false, err
	case ok && other.SPIFFEID != id:
		return nvmegate.HostBinding{}, false, nvmegate.Errorf(nvmegate.ECONFLICT, "the default host NQN of %s is bound to another identity; bind this node explicitly", id)
	}
	return nvmegate.HostBinding{SPIFFEID: id, HostNQN: nqn}, false, nil
}

// grant returns a stored grant, or nil if there is none (or the gateway
// keeps no grants); callersGrant decides what the caller learns of it.
func (d *describer) grant(id string) (*nvmegate.Grant, error) {
	if d.grants == nil {
		return nil, nil
	}
	g, err := d.grants.Grant(d.ctx, id)
	if ok, err := found(err); err != nil || !ok {
		return nil, err
	}
	return g, nil
}

// callersGrant returns the stored grant id if it is the caller's. Any
// other — another node's, of this tenant or another, or none at all — is
// a *notCallersGrant: the caller is refused before policy, which would
// name the grant's job and host NQN in its reasons, and gets the same
// answer whether or not the grant exists (refuseGrant). Without a grant
// store the call is about no grant (nil, nil).
func (d *describer) callersGrant(id string) (*nvmegate.Grant, error) {
	if d.grants == nil {
		return nil, nil
	}
	g, err := d.grant(id)
	if err != nil {
		return nil, err
	}
	caller, ok := identity.PeerID(d.ctx)
	if g == nil || !ok || g.Node != caller.String() {
		return nil, &notCallersGrant{id: id, grant: g}
	}
	return g, nil
}

// notCallersGrant is callersGrant's refusal: grant is the stored grant of
// that ID, nil if there is none.
type notCallersGrant struct {
	id    string
	grant *nvmegate.Grant
}

func (e *notCallersGrant) Error() string { return "grant " + e.id + " is not the caller's" }

// subsystemCall describes a node's connect (or renew) to a subsystem in a
// job: nodeCall's description, the stored subsystem and its target, and
// every namespace on the subsystem (a connected host sees them all), each
// with the mode the job gives it ("" for one the job does not name).
func (d *describer) subsystemCall(jobID, subNQN, hostNQN, ttl string) (map[string]any, error) {
	sc, rev, err := d.subsystemScope(jobID, subNQN, hostNQN, ttl)
	if err != nil {
		return nil, err
	}
	if d.keepScopeAt(sc, rev) && typedCall(sc) {
		// Policy gets the resource typed (policyScope): no map is built
		// for a node's every connect. What needs the map (a refusal's
		// audit entry) asks the input for it (authz.Input.ResourceMap).
		return nil, nil
	}
	return scopeResource(sc), nil
}

// subsystemScope reads the scope of subsystemCall, and the store revision
// it was read wholly at (0: a change landed while it read, or the store
// tells none).
func (d *describer) subsystemScope(jobID, subNQN, hostNQN, ttl string) (*nvmegate.Scope, uint64, error) {
	var rev uint64
	if d.revisions != nil {
		rev = d.revisions.ScopeRevision()
	}
	sc, err := d.nodeScope(jobID)
	if err != nil {
		return nil, 0, err
	}
	sc.SubsystemNQN, sc.HostNQN, sc.TTL = subNQN, hostNQN, ttl
	if sc.Subsystem, err = d.subsystemRec(subNQN); err != nil {
		return nil, 0, err
	}
	if sc.Subsystem != nil {
		if sc.Target, err = d.targetRec(sc.Subsystem.TargetID); err != nil {
			return nil, 0, err
		}
	}
	modes := map[uint32]string{}
	for _, n := range sc.Namespaces {
		if n.Key.SubsystemNQN == subNQN {
			modes[n.Key.NSID] = n.Mode
		}
	}
	all, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
		return d.store.ListNamespaces(d.ctx, store.NamespaceFilter{SubsystemNQN: subNQN}, p)
	})
	if err != nil {
		return nil, 0, err
	}
	nss := make([]nvmegate.ScopeNamespace, 0, len(all))
	for _, n := range all {
		sn, err := d.scopeNamespace(n.Key(), n, modes[n.NSID])
		if err != nil {
			return nil, 0, err
		}
		nss = append(nss, sn)
	}
	sc.Namespaces = nss
	if rev != 0 && d.revisions.ScopeRevision() != rev {
		rev = 0 // a change landed while the records were read
	}
	return sc, rev, nil
}

// nodeCall describes a node's call in a job (discover, release): the
// stored job, the caller's binding and the job's namespaces with the modes
// the job gives them.
func (d *describer) nodeCall(jobID string) (map[string]any, error) {
	sc, err := d.nodeScope(jobID)
	if err != nil {
		return nil, err
	}
	d.keepScope(sc)
	return scopeResource(sc), nil
}

// nodeScope reads the scope of a node's call in a job: the stored job,
// whether the caller is one of its nodes, the caller's binding, and the
// job's namespaces with their modes.
func (d *describer) nodeScope(jobID string) (*nvmegate.Scope, error) {
	caller := d.caller
	if caller == "" {
		id, _ := identity.PeerID(d.ctx)
		caller = id.String()
	}
	sc := &nvmegate.Scope{Caller: caller, JobID: jobID}
	if d.jobs != nil {
		j, err := d.jobs.Job(d.ctx, jobID)
		if ok, err := found(err); err != nil {
			return nil, err
		} else if ok {
			sc.Job = j
			sc.Member = d.members.has(j, sc.Caller)
		}
	}
	b, bound, err := d.nodeBindingRec(sc.Caller)
	if err != nil {
		return nil, err
	}
	sc.Binding, sc.Bound = b, bound
	if sc.Job != nil {
		sc.Namespaces = make([]nvmegate.ScopeNamespace, 0, len(sc.Job.Namespaces))
		for _, jn := range sc.Job.Namespaces {
			key := nvmegate.NamespaceKey{SubsystemNQN: jn.SubsystemNQN, NSID: jn.NSID}
			n, err := d.store.Namespace(d.ctx, jn.SubsystemNQN, jn.NSID)
			if ok, err := found(err); err != nil {
				return nil, err
			} else if !ok {
				n = nil
			}
			sn, err := d.scopeNamespace(key, n, jn.Mode)
			if err != nil {
				return nil, err
			}
			sc.Namespaces = append(sc.Namespaces, sn)
		}
	}
	return sc, nil
}

// scopeNamespace is namespace n (nil: not in the inventory) with mode and
// the target its data is on.
func (d *describer) scopeNamespace(key nvmegate.NamespaceKey, n *nvmegate.Namespace, mode string) (nvmegate.ScopeNamespace, error) {
	sn := nvmegate.ScopeNamespace{Key: key, Namespace: n, Mode: mode}
	if n == nil {
		return sn, nil
	}
	sub, err := d.subsystemRec(n.SubsystemNQN)
	if err != nil || sub == nil {
		return sn, err
	}
	sn.Target, err = d.targetRec(sub.TargetID)
	return sn, err
}

// scopeResource is a node call's scope as policy's input.resource
// (policy/README.md): kind "job", the job's tenant, the job (its node list
// narrowed to the caller: node rules only ask whether the caller is a
// member, and a 10,000-node job would otherwise be converted into every
// node's every decision), the binding, the request, and for a subsystem
// call the subsystem and its target.
func scopeResource(sc *nvmegate.Scope) map[string]any {
	out := res("job", sc.Tenant())
	if sc.Job != nil {
		var member []string
		if sc.Member {
			member = []string{sc.Caller}
		}
		out["job"] = jobValueWith(sc.Job, member)
	} else {
		out["job"] = map[string]any{"job_id": sc.JobID}
	}
	out["host_binding"] = bindingValue(&sc.Binding, sc.Bound)
	out["request"] = map[string]any{"host_nqn": sc.HostNQN, "mode": ""}
	if sc.SubsystemNQN != "" {
		out["request"] = map[string]any{"host_nqn": sc.HostNQN, "ttl": sc.TTL, "mode": ""}
		switch {
		case sc.Subsystem == nil:
			out["subsystem"] = map[string]any{"nqn": sc.SubsystemNQN}
		default:
			out["subsystem"] = subsystemValue(sc.Subsystem)
			if sc.Target != nil {
				out["target"] = targetValue(sc.Target)
				ports := []any{}
				for _, p := range subsystemPorts(sc.Subsystem, sc.Target) {
					ports = append(ports, map[string]any{"id": int64(p.ID), "subnet": p.Subnet})
				}
				out["ports"] = ports
			}
		}
	}
	nss := make([]any, 0, len(sc.Namespaces))
	for _, n := range sc.Namespaces {
		if n.Namespace == nil {
			nss = append(nss, map[string]any{"subsystem_nqn": n.Key.SubsystemNQN, "nsid": int64(n.Key.NSID), "mode": n.Mode})
			continue
		}
		nss = append(nss, namespaceValueAt(n.Namespace, n.Mode, n.Target))
	}
	out["namespaces"] = nss
	return out
}

// admit describes a job admission: the requested scope, with the stored
// record of every namespace it names and the binding of every node.
func (d *describer) admit(r *pb.AdmitRequest) (map[string]any, error) {
	out := res("job", r.Tenant)
	nodes := make([]any, 0, len(r.Nodes))
	for _, id := range r.Nodes {
		b, err := d.nodeBinding(id)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, b)
	}
	out["nodes"] = nodes
	nss := make([]any, 0, len(r.Namespaces))
	for _, jn := range r.Namespaces {
		mode := nvmegate.ModeReadOnly
		if jn.Mode == pb.AccessMode_ACCESS_MODE_READ_WRITE {
			mode = nvmegate.ModeReadWrite
		}
		n, err := d.store.Namespace(d.ctx, jn.SubsystemNqn, jn.Nsid)
		ok, err := found(err)
		if err != nil {
			return nil, err
		}
		if !ok {
			// Unknown to the inventory: no tenant, so policy refuses it.
			nss = append(nss, map[string]any{"subsystem_nqn": jn.SubsystemNqn, "nsid": int64(jn.Nsid), "mode": mode})
			continue
		}
		v, err := d.namespaceValue(n, mode)
		if err != nil {
			return nil, err
		}
		nss = append(nss, v)
	}
	out["namespaces"] = nss
	scheduler, _ := identity.PeerID(d.ctx)
	out["job"] = map[string]any{
		"job_id": r.JobId, "tenant": r.Tenant, "scheduler": scheduler.String(), "nodes": anySlice(r.Nodes),
		"allowed_regions": anySlice(r.AllowedRegions), "expires_at": r.ExpiresAt.AsTime().UTC().Format(time.RFC3339Nano),
		"state": "requested", "generation": int64(r.Generation), "user": r.User,
	}
	return out, nil
}

// updateNodes describes a change of a job's nodes as the admission of the
// job with its new node set (policy decides it as it decides an
// admission): the stored scope, the binding of every node it would have,
// and the state it is in. A job that is not stored is described by its ID
// only, which policy refuses.
func (d *describer) updateNodes(r *pb.UpdateNodesRequest) (map[string]any, error) {
	if d.jobs == nil {
		return d.job(r.JobId)
	}
	j, err := d.jobs.Job(d.ctx, r.JobId)
	if ok, err := found(err); err != nil || !ok {
		out := res("job", "")
		out["job"] = map[string]any{"job_id": r.JobId}
		return out, err
	}
	// As the store merges them (store.UpdateJobNodes), in linear time: a
	// 100,000-node change is described before policy decides.
	gone := make(map[string]bool, len(r.RemoveNodes))
	for _, n := range r.RemoveNodes {
		gone[n] = true
	}
	have := make(map[string]bool, len(j.Nodes)+len(r.AddNodes))
	nodes := make([]string, 0, len(j.Nodes)+len(r.AddNodes))
	for _, n := range j.Nodes {
		if !gone[n] {
			nodes, have[n] = append(nodes, n), true
		}
	}
	for _, n := range r.AddNodes {
		if !have[n] && !gone[n] {
			nodes, have[n] = append(nodes, n), true
		}
	}
	as := &pb.AdmitRequest{JobId: j.ID, Tenant: j.Tenant, Nodes: nodes, AllowedRegions: j.AllowedRegions,
		ExpiresAt: timestamppb.New(j.ExpiresAt), Generation: j.Generation, User: j.User}
	for _, n := range j.Namespaces {
		m := pb.AccessMode_ACCESS_MODE_READ_ONLY
		if n.Mode == nvmegate.ModeReadWrite {
			m = pb.AccessMode_ACCESS_MODE_READ_WRITE
		}
		as.Namespaces = append(as.Namespaces, &pb.JobNamespace{SubsystemNqn: n.SubsystemNQN, Nsid: n.NSID, Mode: m})
	}
	out, err := d.admit(as)
	if err != nil {
		return nil, err
	}
	job := out["job"].(map[string]any)
	job["state"], job["scheduler"] = j.State, j.Scheduler
	return out, nil
}

func (d *describer) job(id string) (map[string]any, error) {
	out := res("job", "")
	out["job"] = map[string]any{"job_id": id}
	if d.jobs == nil {
		return out, nil
	}
	j, err := d.jobs.Job(d.ctx, id)
	if ok, err := found(err); err != nil || !ok {
		return out, err
	}
	out["tenant"] = j.Tenant
	out["job"] = jobValue(j)
	return out, nil
}

// jobValue describes a stored job for policy (policy/README.md), with
// its run (generation) and user for the job's own calls.
func jobValue(j *nvmegate.Job) map[string]any {
	v := jobValueWith(j, j.Nodes)
	v["generation"], v["user"] = int64(j.Generation), j.User
	return v
}

// jobValueWith describes j with nodes as its node list (a node's call
// carries only the caller: converting a 10,000-node list for every call
// of a storm was O(job size) per call).
func jobValueWith(j *nvmegate.Job, nodes []string) map[string]any {
	return map[string]any{
		"job_id": j.ID, "tenant": j.Tenant, "scheduler": j.Scheduler, "nodes": anySlice(nodes),
		"allowed_regions": anySlice(j.AllowedRegions), "expires_at": j.ExpiresAt.UTC().Format(time.RFC3339Nano),
		"state": j.State,
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
