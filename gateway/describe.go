package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate/authz"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// describe tells policy what a request is about: an action name derived from
// the RPC ("/nvmegate.v1.Inventory/AddTarget" → "inventory.add_target") and
// the attributes the request carries (kind, keys, and for Adds the new
// record's tenant, region and class). Requests arrive here validated.
//
// These are the caller's claims, not stored facts: the foundation policy
// only lets admins use the inventory, so that is enough. Tenant-scoped reads
// (the Policy issue) must look the stored record up here and hand policy its
// tenant, region and class instead.
func describe(_ context.Context, fullMethod string, req any) (string, map[string]any, error) {
	return authz.ActionFromMethod(fullMethod), resourceOf(req), nil
}

func resourceOf(req any) map[string]any {
	switch r := req.(type) {
	case *pb.AddTargetRequest:
		return map[string]any{"kind": "target", "id": r.Target.GetId(), "region": r.Target.GetRegion(), "fabric": r.Target.GetFabric()}
	case *pb.GetTargetRequest:
		return map[string]any{"kind": "target", "id": r.Id}
	case *pb.RemoveTargetRequest:
		return map[string]any{"kind": "target", "id": r.Id}
	case *pb.ListTargetsRequest:
		return map[string]any{"kind": "target"}
	case *pb.AddSubsystemRequest:
		return map[string]any{"kind": "subsystem", "nqn": r.Subsystem.GetNqn(), "tenant": r.Subsystem.GetTenant(), "target_id": r.Subsystem.GetTargetId()}
	case *pb.GetSubsystemRequest:
		return map[string]any{"kind": "subsystem", "nqn": r.Nqn}
	case *pb.RemoveSubsystemRequest:
		return map[string]any{"kind": "subsystem", "nqn": r.Nqn}
	case *pb.ListSubsystemsRequest:
		return map[string]any{"kind": "subsystem", "tenant": r.Tenant}
	case *pb.AddNamespaceRequest:
		n := r.Namespace
		return map[string]any{
			"kind": "namespace", "subsystem_nqn": n.GetSubsystemNqn(), "nsid": n.GetNsid(), "tenant": n.GetTenant(),
			"region": n.GetRegion(), "data_class": n.GetDataClass(),
		}
	case *pb.GetNamespaceRequest:
		return map[string]any{"kind": "namespace", "subsystem_nqn": r.SubsystemNqn, "nsid": r.Nsid}
	case *pb.RemoveNamespaceRequest:
		return map[string]any{"kind": "namespace", "subsystem_nqn": r.SubsystemNqn, "nsid": r.Nsid}
	case *pb.ListNamespacesRequest:
		return map[string]any{"kind": "namespace", "tenant": r.Tenant}
	case *pb.AddHostBindingRequest:
		return map[string]any{"kind": "host_binding", "spiffe_id": r.Binding.GetSpiffeId(), "tenant": r.Binding.GetTenant()}
	case *pb.GetHostBindingRequest:
		return map[string]any{"kind": "host_binding", "spiffe_id": r.SpiffeId}
	case *pb.RemoveHostBindingRequest:
		return map[string]any{"kind": "host_binding", "spiffe_id": r.SpiffeId}
	case *pb.ListHostBindingsRequest:
		return map[string]any{"kind": "host_binding", "tenant": r.Tenant}
	case *pb.AdmitRequest:
		return map[string]any{"kind": "job", "job_id": r.JobId, "tenant": r.Tenant}
	case interface{ GetJobId() string }:
		return map[string]any{"kind": "job", "job_id": r.GetJobId()}
	}
	return map[string]any{}
}
