package gateway

import (
	"context"
	"errors"
	"fmt"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/lease"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// InventoryStore is what the Inventory service needs of a store. The bbolt
// store implements it; an etcd store for several replicas will too.
type InventoryStore interface {
	// Revision is the revision of the store's latest applied change.
	Revision() uint64
	CreateTarget(ctx context.Context, t *nvmegate.Target) error
	Target(ctx context.Context, id string) (*nvmegate.Target, error)
	ListTargets(ctx context.Context, f store.TargetFilter, p store.Page) ([]*nvmegate.Target, string, error)
	DeleteTarget(ctx context.Context, id string) error

	CreateSubsystem(ctx context.Context, s *nvmegate.Subsystem) error
	Subsystem(ctx context.Context, nqn string) (*nvmegate.Subsystem, error)
	ListSubsystems(ctx context.Context, f store.SubsystemFilter, p store.Page) ([]*nvmegate.Subsystem, string, error)
	DeleteSubsystem(ctx context.Context, nqn string) error

	CreateNamespace(ctx context.Context, n *nvmegate.Namespace) error
	Namespace(ctx context.Context, nqn string, nsid uint32) (*nvmegate.Namespace, error)
	ListNamespaces(ctx context.Context, f store.NamespaceFilter, p store.Page) ([]*nvmegate.Namespace, string, error)
	DeleteNamespace(ctx context.Context, nqn string, nsid uint32) error

	CreateHostBinding(ctx context.Context, h *nvmegate.HostBinding) error
	HostBinding(ctx context.Context, spiffeID string) (*nvmegate.HostBinding, error)
	HostBindingByNQN(ctx context.Context, hostNQN string) (*nvmegate.HostBinding, error)
	ListHostBindings(ctx context.Context, f store.HostBindingFilter, p store.Page) ([]*nvmegate.HostBinding, string, error)
	DeleteHostBinding(ctx context.Context, spiffeID string) error
}

// inventoryService implements pb.InventoryServer. Requests arrive validated
// and authorized by the interceptors; store errors map to statuses in the
// interceptor chain (status.go).
type inventoryService struct {
	pb.UnimplementedInventoryServer
	store InventoryStore
	// targets, if set, hears of every change of a target, its subsystems
	// or their namespaces: the target's next programming run rebuilds its
	// state whole (a grant change only touches its host entry).
	targets TargetProgrammer
	// rebind, if set, rotates the roots an NQN's earlier holders knew
	// before the NQN is bound (lease.Lifecycle.Rebind), and ends a node's
	// grants when its binding is removed.
	rebind Rebinder
	// erase, if set, destroys a removed namespace's data key (crypto-erase)
	// and tells who a stored data key belongs to.
	erase DataKeyEraser
}

// DataKeyEraser destroys a namespace's data key and KEK, and tells which
// namespace record a stored data key belongs to (keys.Manager).
type DataKeyEraser interface {
	DestroyDataKey(ctx context.Context, namespace, reason string) error
	DataKeyOwner(ctx context.Context, namespace string) (owner string, found bool, err error)
}

// Rebinder prepares a host NQN for a new holder and ends the grants of a
// node whose binding goes (lease.Lifecycle).
type Rebinder interface {
	Rebind(ctx context.Context, nqn, node string) error
	Revoke(ctx context.Context, sel lease.Selection, caller, why string) ([]string, error)
}

// changed tells the target programmer that target id's inventory changed.
func (s *inventoryService) changed(id string) {
	if s.targets != nil && id != "" {
		s.targets.InventoryChanged(id)
	}
}

// targetOf is the target of subsystem nqn ("" if it cannot be read: then
// there is nothing of it to change either).
func (s *inventoryService) targetOf(ctx context.Context, nqn string) string {
	sub, err := s.store.Subsystem(ctx, nqn)
	if err != nil {
		return ""
	}
	return sub.TargetID
}

func (s *inventoryService) AddTarget(ctx context.Context, r *pb.AddTargetRequest) (*pb.AddTargetResponse, error) {
	t, err := targetFromProto(r.Target)
	if err != nil {
		return nil, nvmegate.WithFieldPrefix("target", err)
	}
	if err := s.store.CreateTarget(ctx, t); err != nil {
		return nil, nvmegate.WithFieldPrefix("target", err)
	}
	s.changed(t.ID)
	return &pb.AddTargetResponse{Target: targetToProto(t)}, nil
}

func (s *inventoryService) GetTarget(ctx context.Context, r *pb.GetTargetRequest) (*pb.GetTargetResponse, error) {
	t, err := s.store.Target(ctx, r.Id)
	if err != nil {
		return nil, err
	}
	return &pb.GetTargetResponse{Target: targetToProto(t)}, nil
}

func (s *inventoryService) ListTargets(ctx context.Context, r *pb.ListTargetsRequest) (*pb.ListTargetsResponse, error) {
	ts, next, err := s.store.ListTargets(ctx, store.TargetFilter{Region: r.Region, Fabric: r.Fabric}, store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	resp := &pb.ListTargetsResponse{NextPageToken: next}
	for _, t := range ts {
		resp.Targets = append(resp.Targets, targetToProto(t))
	}
	return resp, nil
}

func (s *inventoryService) RemoveTarget(ctx context.Context, r *pb.RemoveTargetRequest) (*pb.RemoveTargetResponse, error) {
	defer s.changed(r.Id)
	return &pb.RemoveTargetResponse{}, s.store.DeleteTarget(ctx, r.Id)
}

func (s *inventoryService) AddSubsystem(ctx context.Context, r *pb.AddSubsystemRequest) (*pb.AddSubsystemResponse, error) {
	sub, err := subsystemFromProto(r.Subsystem)
	if err != nil {
		return nil, nvmegate.WithFieldPrefix("subsystem", err)
	}
	if err := s.store.CreateSubsystem(ctx, sub); err != nil {
		return nil, nvmegate.WithFieldPrefix("subsystem", err)
	}
	s.changed(sub.TargetID)
	return &pb.AddSubsystemResponse{Subsystem: subsystemToProto(sub)}, nil
}

func (s *inventoryService) GetSubsystem(ctx context.Context, r *pb.GetSubsystemRequest) (*pb.GetSubsystemResponse, error) {
	sub, err := s.store.Subsystem(ctx, r.Nqn)
	if err != nil {
		return nil, err
	}
	return &pb.GetSubsystemResponse{Subsystem: subsystemToProto(sub)}, nil
}

func (s *inventoryService) ListSubsystems(ctx context.Context, r *pb.ListSubsystemsRequest) (*pb.ListSubsystemsResponse, error) {
	subs, next, err := s.store.ListSubsystems(ctx, store.SubsystemFilter{Tenant: r.Tenant, TargetID: r.TargetId}, store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	resp := &pb.ListSubsystemsResponse{NextPageToken: next}
	for _, sub := range subs {
		resp.Subsystems = append(resp.Subsystems, subsystemToProto(sub))
	}
	return resp, nil
}

func (s *inventoryService) RemoveSubsystem(ctx context.Context, r *pb.RemoveSubsystemRequest) (*pb.RemoveSubsystemResponse, error) {
	defer s.changed(s.targetOf(ctx, r.Nqn)) // read before the subsystem goes
	return &pb.RemoveSubsystemResponse{}, s.store.DeleteSubsystem(ctx, r.Nqn)
}

func (s *inventoryService) AddNamespace(ctx context.Context, r *pb.AddNamespaceRequest) (*pb.AddNamespaceResponse, error) {
	n, err := namespaceFromProto(r.Namespace)
	if err != nil {
		return nil, nvmegate.WithFieldPrefix("namespace", err)
	}
	if err := s.leftoverKey(ctx, n); err != nil {
		return nil, err
	}
	if err := s.store.CreateNamespace(ctx, n); err != nil {
		return nil, nvmegate.WithFieldPrefix("namespace", err)
	}
	s.changed(s.targetOf(ctx, n.SubsystemNQN))
	return &pb.AddNamespaceResponse{Namespace: namespaceToProto(n)}, nil
}

func (s *inventoryService) GetNamespace(ctx context.Context, r *pb.GetNamespaceRequest) (*pb.GetNamespaceResponse, error) {
	n, err := s.store.Namespace(ctx, r.SubsystemNqn, r.Nsid)
	if err != nil {
		return nil, err
	}
	return &pb.GetNamespaceResponse{Namespace: namespaceToProto(n)}, nil
}

func (s *inventoryService) ListNamespaces(ctx context.Context, r *pb.ListNamespacesRequest) (*pb.ListNamespacesResponse, error) {
	ns, next, err := s.store.ListNamespaces(ctx, store.NamespaceFilter{Tenant: r.Tenant, SubsystemNQN: r.SubsystemNqn, Region: r.Region}, store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	resp := &pb.ListNamespacesResponse{NextPageToken: next}
	for _, n := range ns {
		resp.Namespaces = append(resp.Namespaces, namespaceToProto(n))
	}
	return resp, nil
}

// leftoverKey refuses a namespace to be encrypted at rest whose name
// still holds the data key of a namespace removed without erase: the new
// record would never get that key (keys.ErrForeign), so its target could
// not open it; the caller is told how to free the name now rather than
// find the namespace unserved later.
func (s *inventoryService) leftoverKey(ctx context.Context, n *nvmegate.Namespace) error {
	if s.erase == nil || n.BackingDevice == "" {
		return nil
	}
	if _, found, err := s.erase.DataKeyOwner(ctx, n.Key().KeyName()); err != nil || !found {
		return keyErr(err)
	}
	return nvmegate.Errorf(nvmegate.ECONFLICT,
		"namespace %d of %s: the data key of a namespace removed without erase is still stored under this subsystem NQN and NSID, and a new namespace never inherits it; erase it first (inventory namespace remove --erase), or use another NSID",
		n.NSID, n.SubsystemNQN)
}

// RemoveNamespace removes a namespace from the inventory, and with erase
// crypto-erases it. A plain remove keeps the data key, and says so: the
// key stays bound to the removed record, no namespace added again under
// the name gets it, and only an erase destroys it.
func (s *inventoryService) RemoveNamespace(ctx context.Context, r *pb.RemoveNamespaceRequest) (*pb.RemoveNamespaceResponse, error) {
	if r.Erase {
		return s.eraseNamespace(ctx, r)
	}
	n, err := s.store.Namespace(ctx, r.SubsystemNqn, r.Nsid)
	if err != nil {
		return nil, err
	}
	defer s.changed(s.targetOf(ctx, r.SubsystemNqn))
	if err := s.store.DeleteNamespace(ctx, r.SubsystemNqn, r.Nsid); err != nil {
		return nil, err
	}
	resp := &pb.RemoveNamespaceResponse{DataKey: "none: nvmegate holds no data key for this namespace"}
	if s.erase != nil {
		owner, found, err := s.erase.DataKeyOwner(ctx, n.Key().KeyName())
		switch {
		case err != nil:
			resp.DataKey = "unknown: the key store did not answer; if one exists it is kept, bound to the removed namespace; erase it with remove --erase"
		case found && owner == n.Incarnation:
			resp.DataKey = "kept: bound to the removed namespace, never given to a namespace added again under this NQN and NSID (which is refused until the key is erased); destroy it with remove --erase"
		case found:
			resp.DataKey = "none of this namespace's; a key left by an earlier namespace of this NQN and NSID is stored, bound to that one: destroy it with remove --erase"
		}
	}
	return resp, nil
}

// eraseNamespace removes a namespace and crypto-erases it: the target
// applies a state without it (its agent disables the namespace and closes
// the dm-crypt mapping, the only place the key was held unwrapped) and
// acknowledges it; only then are the data key and its KEK destroyed,
// recorded in the audit log. A target that does not confirm leaves the
// key, and says so (UNAVAILABLE); the call may be repeated on the removed
// namespace until the key is gone.
func (s *inventoryService) eraseNamespace(ctx context.Context, r *pb.RemoveNamespaceRequest) (*pb.RemoveNamespaceResponse, error) {
	if s.erase == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no data keys: nothing to erase")
	}
	// The target must be known for sure: the key is destroyed only after
	// it confirmed closing the mapping (targetOf's "" on any error would
	// skip that).
	// Without its subsystem nothing can confirm it: refused.
	sub, err := s.store.Subsystem(ctx, r.SubsystemNqn)
	if err != nil {
		return nil, err
	}
	target := sub.TargetID
	err = s.store.DeleteNamespace(ctx, r.SubsystemNqn, r.Nsid)
	gone := nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND // a repeated erase
	if err != nil && !gone {
		return nil, err
	}
	if s.targets != nil {
		s.targets.InventoryChanged(target)
		if err := s.targets.Program(ctx, target); err != nil {
			return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE,
				"namespace %d of %s is removed, but its data key is kept: target %s has not confirmed closing its mapping (%v); repeat the removal with erase",
				r.Nsid, r.SubsystemNqn, target, err)
		}
	}
	name := NamespaceKeyName(r.SubsystemNqn, r.Nsid)
	err = s.erase.DestroyDataKey(ctx, name, "namespace removed with erase by "+callerID(ctx))
	switch {
	case errors.Is(err, keys.ErrNotFound) && gone:
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "namespace %d of %s: no such namespace and no data key", r.Nsid, r.SubsystemNqn)
	case errors.Is(err, keys.ErrNotFound):
		// It never had a data key (never exported by nvmegate): nothing
		// of it to erase.
		return &pb.RemoveNamespaceResponse{DataKey: "none: nvmegate held no data key for this namespace"}, nil
	case err != nil:
		return nil, keyErr(err)
	}
	return &pb.RemoveNamespaceResponse{DataKey: "destroyed: the data key and every version of its KEK (crypto-erase, recorded in the audit log)"}, nil
}

// AddHostBinding binds a node to a host NQN. Besides validation (the NQN
// in canonical form: a UUID NQN in lower case, InvalidArgument otherwise),
// the store refuses with FailedPrecondition an NQN bound to another
// identity, compared canonically, and one that an active grant of another
// identity uses (naming the grant: revoke it first), for the targets would
// take the new node for that grant's host (issue 14).
func (s *inventoryService) AddHostBinding(ctx context.Context, r *pb.AddHostBindingRequest) (*pb.AddHostBindingResponse, error) {
	h, err := hostBindingFromProto(r.Binding)
	if err != nil {
		return nil, nvmegate.WithFieldPrefix("binding", err)
	}
	// Before the binding: another identity that held the NQN (its grants
	// released or expired) still knows what the new holder would be
	// given under the same root. A binding the store would refuse
	// rotates nothing: those refusals are checked first (and again in
	// the binding's commit).
	if _, err := s.store.HostBinding(ctx, h.SPIFFEID); err == nil {
		return nil, nvmegate.Errorf(nvmegate.EEXISTS, "host binding for %q already exists", h.SPIFFEID)
	}
	if _, err := s.store.HostBindingByNQN(ctx, h.HostNQN); err == nil {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "host NQN %q is already bound to another identity", h.HostNQN)
	}
	if s.rebind != nil {
		if err := s.rebind.Rebind(ctx, h.HostNQN, h.SPIFFEID); err != nil {
			return nil, err
		}
	}
	if err := s.store.CreateHostBinding(ctx, h); err != nil {
		return nil, nvmegate.WithFieldPrefix("binding", err)
	}
	return &pb.AddHostBindingResponse{Binding: hostBindingToProto(h)}, nil
}

func (s *inventoryService) GetHostBinding(ctx context.Context, r *pb.GetHostBindingRequest) (*pb.GetHostBindingResponse, error) {
	h, err := s.store.HostBinding(ctx, r.SpiffeId)
	if err != nil {
		return nil, err
	}
	return &pb.GetHostBindingResponse{Binding: hostBindingToProto(h)}, nil
}

func (s *inventoryService) ListHostBindings(ctx context.Context, r *pb.ListHostBindingsRequest) (*pb.ListHostBindingsResponse, error) {
	hs, next, err := s.store.ListHostBindings(ctx, store.HostBindingFilter{Tenant: r.Tenant}, store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	resp := &pb.ListHostBindingsResponse{NextPageToken: next}
	for _, h := range hs {
		resp.Bindings = append(resp.Bindings, hostBindingToProto(h))
	}
	return resp, nil
}

// RemoveHostBinding removes a node's binding and ends its access: the
// node's active grants are revoked (each recorded, its host off its
// target, the roots it knew rotated) before the binding goes, and again
// after, for a connect that committed in between; a connect that commits
// later is refused in its commit (store.BindingAt: the binding it was
// decided with is gone). It answers OK only once the binding is gone and
// every grant of the node is revoked; otherwise it says which steps
// happened and which did not.
func (s *inventoryService) RemoveHostBinding(ctx context.Context, r *pb.RemoveHostBindingRequest) (*pb.RemoveHostBindingResponse, error) {
	if s.rebind == nil {
		return &pb.RemoveHostBindingResponse{}, s.store.DeleteHostBinding(ctx, r.SpiffeId)
	}
	if _, err := s.store.HostBinding(ctx, r.SpiffeId); err != nil {
		return nil, err
	}
	why := "host binding of " + r.SpiffeId + " removed"
	sel := lease.Selection{Node: r.SpiffeId}
	if _, err := s.rebind.Revoke(ctx, sel, callerID(ctx), why); err != nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "host binding of %s kept: its grants were revoked in part, or a target has not yet removed a host (%s); retry", r.SpiffeId, nvmegate.ErrorMessage(err))
	}
	if err := s.store.DeleteHostBinding(ctx, r.SpiffeId); err != nil {
		return nil, fmt.Errorf("the node's grants were revoked, its host binding not removed: %w", err)
	}
	if _, err := s.rebind.Revoke(context.WithoutCancel(ctx), sel, callerID(ctx), why); err != nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "host binding of %s removed and its grants revoked, but a grant made meanwhile was revoked in part or its target has not yet removed its host (%s); the gateway retries", r.SpiffeId, nvmegate.ErrorMessage(err))
	}
	return &pb.RemoveHostBindingResponse{}, nil
}
