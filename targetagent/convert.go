package targetagent

import (
	"github.com/nvmegate/nvmegate/fabric"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// UpdateToProto converts an update for the stream to a remote agent.
func UpdateToProto(id string, u Update) *pb.WatchResponse {
	if u.Delta == nil {
		m := StateToProto(id, *u.State)
		m.StoreRevision = u.Revision
		return m
	}
	d := &pb.TargetDelta{BaseGeneration: u.Delta.Base}
	for _, c := range u.Delta.Hosts {
		h := hostToProto(c.Host)
		if c.Remove {
			h = &pb.TargetHost{Nqn: c.Host.NQN} // a removal carries no credentials
		}
		d.Hosts = append(d.Hosts, &pb.TargetHostChange{SubsystemNqn: c.Subsystem, Host: h, Remove: c.Remove})
	}
	return &pb.WatchResponse{TargetId: id, Generation: u.Delta.Generation, Delta: d, StoreRevision: u.Revision}
}

// UpdateFromProto converts a streamed update for a driver (the remote
// agent's side): a delta if the message has one, else the whole state.
func UpdateFromProto(p *pb.WatchResponse) Update {
	if p.Delta == nil {
		return Update{State: new(StateFromProto(p)), Revision: p.StoreRevision}
	}
	d := &fabric.Delta{Base: p.Delta.BaseGeneration, Generation: p.Generation}
	for _, c := range p.Delta.Hosts {
		d.Hosts = append(d.Hosts, fabric.HostChange{Subsystem: c.SubsystemNqn, Remove: c.Remove, Host: hostFromProto(c.Host)})
	}
	return Update{Delta: d, Revision: p.StoreRevision}
}

// StateToProto converts a whole desired state for the stream to a remote
// agent.
func StateToProto(id string, st fabric.State) *pb.WatchResponse {
	out := &pb.WatchResponse{TargetId: id, Generation: st.Generation}
	for _, sub := range st.Subsystems {
		ps := &pb.TargetSubsystem{Nqn: sub.NQN}
		for _, h := range sub.Hosts {
			ps.Hosts = append(ps.Hosts, hostToProto(h))
		}
		for _, n := range sub.Namespaces {
			ps.Namespaces = append(ps.Namespaces, &pb.TargetNamespace{Nsid: n.NSID, MaxIops: n.MaxIOPS, MaxMbps: n.MaxMBps,
				BackingDevice: n.BackingDevice, DataKey: n.DataKey, NextDataKey: n.NextDataKey, NextGeneration: n.NextGeneration})
		}
		for _, p := range sub.Ports {
			ps.Ports = append(ps.Ports, &pb.TargetPort{Id: uint32(p.ID), Trtype: p.Trtype, Adrfam: p.Adrfam, Traddr: p.Traddr,
				Trsvcid: p.Trsvcid, Treq: p.Treq, Tsas: p.Tsas})
		}
		out.Subsystems = append(out.Subsystems, ps)
	}
	return out
}

// StateFromProto converts a streamed whole state for a driver (the remote
// agent's side).
func StateFromProto(p *pb.WatchResponse) fabric.State {
	st := fabric.State{Generation: p.Generation}
	for _, ps := range p.Subsystems {
		sub := fabric.Subsystem{NQN: ps.Nqn}
		for _, h := range ps.Hosts {
			sub.Hosts = append(sub.Hosts, hostFromProto(h))
		}
		for _, n := range ps.Namespaces {
			sub.Namespaces = append(sub.Namespaces, fabric.Namespace{NSID: n.Nsid, MaxIOPS: n.MaxIops, MaxMBps: n.MaxMbps,
				BackingDevice: n.BackingDevice, DataKey: n.DataKey, NextDataKey: n.NextDataKey, NextGeneration: n.NextGeneration})
		}
		for _, p := range ps.Ports {
			sub.Ports = append(sub.Ports, fabric.Port{ID: uint16(p.Id), Trtype: p.Trtype, Adrfam: p.Adrfam, Traddr: p.Traddr,
				Trsvcid: p.Trsvcid, Treq: p.Treq, Tsas: p.Tsas})
		}
		st.Subsystems = append(st.Subsystems, sub)
	}
	return st
}

func hostToProto(h fabric.Host) *pb.TargetHost {
	return &pb.TargetHost{Nqn: h.NQN, DhchapKey: h.DHCHAPKey, DhchapCtrlKey: h.DHCHAPCtrlKey,
		DhchapHash: h.DHCHAPHash, DhchapDhgroup: h.DHCHAPGroup, TlsPsk: h.TLSPSK}
}

// hostFromProto converts a host (nil: none, as in a malformed removal).
func hostFromProto(h *pb.TargetHost) fabric.Host {
	return fabric.Host{NQN: h.GetNqn(), DHCHAPKey: h.GetDhchapKey(), DHCHAPCtrlKey: h.GetDhchapCtrlKey(),
		DHCHAPHash: h.GetDhchapHash(), DHCHAPGroup: h.GetDhchapDhgroup(), TLSPSK: h.GetTlsPsk()}
}

// NotServedToProto converts the namespaces a generation was applied
// without, for the acknowledgement (the remote agent's side).
func NotServedToProto(ns []fabric.NotServed) []*pb.NamespaceNotServed {
	out := make([]*pb.NamespaceNotServed, len(ns))
	for i, n := range ns {
		out[i] = &pb.NamespaceNotServed{SubsystemNqn: n.Subsystem, Nsid: n.NSID, Reason: n.Reason, Exported: n.Exported}
	}
	return out
}
