package gateway

import (
	"context"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// accessService answers the node calls. Policy has decided that the caller
// is a node of the job's active scope, with its own host binding, for the
// job's tenant only.
type accessService struct {
	pb.UnimplementedAccessServer
	store InventoryStore
	jobs  JobStore
}

// Discover lists where the job's subsystems listen, as a discovery
// controller would: one entry per port of each subsystem, with its
// secure-channel requirement, and the host NQN the node must connect with.
func (s *accessService) Discover(ctx context.Context, r *pb.DiscoverRequest) (*pb.DiscoverResponse, error) {
	in, ok := authz.InputFromContext(ctx)
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "discover: call has no authorization input")
	}
	j, err := s.jobs.Job(ctx, r.JobId)
	if err != nil {
		return nil, err
	}
	out := &pb.DiscoverResponse{HostNqn: str(in.Resource, "host_binding", "host_nqn")}
	seen := map[string]bool{}
	for _, jn := range j.Namespaces {
		if seen[jn.SubsystemNQN] {
			continue
		}
		seen[jn.SubsystemNQN] = true
		entries, err := s.discoveryEntries(ctx, jn.SubsystemNQN)
		if err != nil {
			return nil, err
		}
		out.Entries = append(out.Entries, entries...)
	}
	return out, nil
}

// discoveryEntries are a subsystem's ports as NVMe discovery log entries.
func (s *accessService) discoveryEntries(ctx context.Context, nqn string) ([]*pb.DiscoveryEntry, error) {
	sub, err := s.store.Subsystem(ctx, nqn)
	if err != nil {
		return nil, err
	}
	t, err := s.store.Target(ctx, sub.TargetID)
	if err != nil {
		return nil, err
	}
	var out []*pb.DiscoveryEntry
	for _, pid := range sub.PortIDs {
		for _, p := range t.Ports {
			if p.ID != pid {
				continue
			}
			e := &pb.DiscoveryEntry{Trtype: p.Transport, Adrfam: p.AddressFamily, Traddr: p.Address, Trsvcid: p.ServiceID,
				Subnqn: nqn, Portid: uint32(p.ID), Treq: "not required", Sectype: "none"}
			if p.TLS() {
				e.Sectype = "tls1.3"
			}
			if p.SecureChannel == nvmegate.SecureChannelRequired {
				e.Treq = "required"
			}
			out = append(out, e)
		}
	}
	return out, nil
}
