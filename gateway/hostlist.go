package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/hostlist"
	"github.com/nvmegate/nvmegate/identity"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// expandHostlists turns the Slurm hostlists of a job's request into node
// IDs before validation (AdmitRequest.hostlist, UpdateNodesRequest's
// add_hostlist and remove_hostlist): each host h is the node
// spiffe://<the caller's trust domain>/node/h. Validation, policy and the
// audit log then see nodes only, as if the scheduler had named each.
func expandHostlists(ctx context.Context, req any) error {
	switch r := req.(type) {
	case *pb.AdmitRequest:
		if r.Hostlist != "" {
			nodes, err := hostNodes(ctx, "hostlist", r.Hostlist, r.Nodes)
			if err != nil {
				return err
			}
			r.Nodes, r.Hostlist = append(r.Nodes, nodes...), ""
		}
	case *pb.UpdateNodesRequest:
		if r.AddHostlist != "" {
			nodes, err := hostNodes(ctx, "add_hostlist", r.AddHostlist, r.AddNodes)
			if err != nil {
				return err
			}
			r.AddNodes, r.AddHostlist = append(r.AddNodes, nodes...), ""
		}
		if r.RemoveHostlist != "" {
			nodes, err := hostNodes(ctx, "remove_hostlist", r.RemoveHostlist, r.RemoveNodes)
			if err != nil {
				return err
			}
			r.RemoveNodes, r.RemoveHostlist = append(r.RemoveNodes, nodes...), ""
		}
	}
	return nil
}

// hostNodes expands expr (field's) into the node IDs that named lacks.
func hostNodes(ctx context.Context, field, expr string, named []string) ([]string, error) {
	if err := nvmegate.ValidateString(field, expr); err != nil {
		return nil, err
	}
	caller, ok := identity.PeerID(ctx)
	if !ok {
		return nil, nvmegate.Invalid(field, "names hosts of the caller's trust domain, and the caller has no SPIFFE ID")
	}
	hosts, err := hostlist.Expand(expr, nvmegate.MaxJobNodes)
	if err != nil {
		return nil, nvmegate.Invalid(field, "%v", err)
	}
	have := make(map[string]bool, len(named))
	for _, n := range named {
		have[n] = true
	}
	prefix := "spiffe://" + caller.TrustDomain().Name() + "/node/"
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if id := prefix + h; !have[id] {
			out = append(out, id)
		}
	}
	return out, nil
}
