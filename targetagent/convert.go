package targetagent

import (
	"github.com/nvmegate/nvmegate/fabric"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// StateToProto converts a desired state for the stream to a remote agent.
func StateToProto(id string, st fabric.State) *pb.WatchResponse {
	out := &pb.WatchResponse{TargetId: id, Generation: st.Generation}
	for _, sub := range st.Subsystems {
		ps := &pb.TargetSubsystem{Nqn: sub.NQN}
		for _, h := range sub.Hosts {
			ps.Hosts = append(ps.Hosts, &pb.TargetHost{Nqn: h.NQN, DhchapKey: h.DHCHAPKey, DhchapCtrlKey: h.DHCHAPCtrlKey,
				DhchapHash: h.DHCHAPHash, DhchapDhgroup: h.DHCHAPGroup, TlsPsk: h.TLSPSK})
		}
		for _, n := range sub.Namespaces {
			ps.Namespaces = append(ps.Namespaces, &pb.TargetNamespace{Nsid: n.NSID, MaxIops: n.MaxIOPS, MaxMbps: n.MaxMBps})
		}
		for _, p := range sub.Ports {
			ps.Ports = append(ps.Ports, &pb.TargetPort{Id: uint32(p.ID), Trtype: p.Trtype, Adrfam: p.Adrfam, Traddr: p.Traddr,
				Trsvcid: p.Trsvcid, Treq: p.Treq, Tsas: p.Tsas})
		}
		out.Subsystems = append(out.Subsystems, ps)
	}
	return out
}

// StateFromProto converts a streamed state for a driver (the remote
// agent's side).
func StateFromProto(p *pb.WatchResponse) fabric.State {
	st := fabric.State{Generation: p.Generation}
	for _, ps := range p.Subsystems {
		sub := fabric.Subsystem{NQN: ps.Nqn}
		for _, h := range ps.Hosts {
			sub.Hosts = append(sub.Hosts, fabric.Host{NQN: h.Nqn, DHCHAPKey: h.DhchapKey, DHCHAPCtrlKey: h.DhchapCtrlKey,
				DHCHAPHash: h.DhchapHash, DHCHAPGroup: h.DhchapDhgroup, TLSPSK: h.TlsPsk})
		}
		for _, n := range ps.Namespaces {
			sub.Namespaces = append(sub.Namespaces, fabric.Namespace{NSID: n.Nsid, MaxIOPS: n.MaxIops, MaxMBps: n.MaxMbps})
		}
		for _, p := range ps.Ports {
			sub.Ports = append(sub.Ports, fabric.Port{ID: uint16(p.Id), Trtype: p.Trtype, Adrfam: p.Adrfam, Traddr: p.Traddr,
				Trsvcid: p.Trsvcid, Treq: p.Treq, Tsas: p.Tsas})
		}
		st.Subsystems = append(st.Subsystems, sub)
	}
	return st
}
