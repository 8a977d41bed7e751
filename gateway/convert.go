package gateway

import (
	"math"
	"strconv"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Conversions between the API's messages and the domain types. They only
// copy and range-check what the domain types cannot represent (e.g. a port ID
// above 65535); every other rule lives in the domain's Validate methods.

func targetFromProto(p *pb.Target) (*nvmegate.Target, error) {
	if p == nil {
		return nil, nvmegate.Invalid("", "is required")
	}
	t := &nvmegate.Target{ID: p.Id, Fabric: p.Fabric, Region: p.Region, Rack: p.Rack, Driver: p.Driver}
	for i, pp := range p.Ports {
		if pp == nil {
			return nil, nvmegate.Invalid("ports["+strconv.Itoa(i)+"]", "is required")
		}
		if pp.Id == 0 || pp.Id > math.MaxUint16 {
			return nil, nvmegate.Invalid("ports["+strconv.Itoa(i)+"].id", "must be 1-65535 (got %d)", pp.Id)
		}
		t.Ports = append(t.Ports, nvmegate.Port{
			ID: uint16(pp.Id), Transport: pp.Transport, AddressFamily: pp.AddressFamily,
			Address: pp.Address, ServiceID: pp.ServiceId, SecureChannel: pp.SecureChannel, Subnet: pp.Subnet,
		})
	}
	return t, nil
}

func targetToProto(t *nvmegate.Target) *pb.Target {
	p := &pb.Target{Id: t.ID, Fabric: t.Fabric, Region: t.Region, Rack: t.Rack, Driver: t.Driver, CreatedAt: ts(t.CreatedAt)}
	for _, pt := range t.Ports {
		p.Ports = append(p.Ports, &pb.Port{
			Id: uint32(pt.ID), Transport: pt.Transport, AddressFamily: pt.AddressFamily,
			Address: pt.Address, ServiceId: pt.ServiceID, SecureChannel: pt.SecureChannel, Subnet: pt.Subnet,
		})
	}
	return p
}

func subsystemFromProto(p *pb.Subsystem) (*nvmegate.Subsystem, error) {
	if p == nil {
		return nil, nvmegate.Invalid("", "is required")
	}
	s := &nvmegate.Subsystem{NQN: p.Nqn, TargetID: p.TargetId, Tenant: p.Tenant, DHCHAP: p.Dhchap, TLS: p.Tls, Description: p.Description}
	for i, id := range p.PortIds {
		if id == 0 || id > math.MaxUint16 {
			return nil, nvmegate.Invalid("port_ids["+strconv.Itoa(i)+"]", "must be 1-65535 (got %d)", id)
		}
		s.PortIDs = append(s.PortIDs, uint16(id))
	}
	return s, nil
}

func subsystemToProto(s *nvmegate.Subsystem) *pb.Subsystem {
	p := &pb.Subsystem{Nqn: s.NQN, TargetId: s.TargetID, Tenant: s.Tenant, Dhchap: s.DHCHAP, Tls: s.TLS, Description: s.Description, CreatedAt: ts(s.CreatedAt)}
	for _, id := range s.PortIDs {
		p.PortIds = append(p.PortIds, uint32(id))
	}
	return p
}

func namespaceFromProto(p *pb.Namespace) (*nvmegate.Namespace, error) {
	if p == nil {
		return nil, nvmegate.Invalid("", "is required")
	}
	n := &nvmegate.Namespace{
		SubsystemNQN: p.SubsystemNqn, NSID: p.Nsid, Tenant: p.Tenant, Region: p.Region, DataClass: p.DataClass,
		BackingDevice: p.BackingDevice,
	}
	if p.Dataset != nil {
		n.Dataset = nvmegate.Dataset{Name: p.Dataset.Name, Digest: p.Dataset.Digest}
	}
	if p.Qos != nil {
		n.QoS = nvmegate.QoS{MaxIOPS: p.Qos.MaxIops, MaxMBps: p.Qos.MaxMbps}
	}
	return n, nil
}

func namespaceToProto(n *nvmegate.Namespace) *pb.Namespace {
	return &pb.Namespace{
		SubsystemNqn: n.SubsystemNQN, Nsid: n.NSID, Tenant: n.Tenant, Region: n.Region, DataClass: n.DataClass,
		Dataset:       &pb.Dataset{Name: n.Dataset.Name, Digest: n.Dataset.Digest},
		Qos:           &pb.QoS{MaxIops: n.QoS.MaxIOPS, MaxMbps: n.QoS.MaxMBps},
		BackingDevice: n.BackingDevice,
		CreatedAt:     ts(n.CreatedAt),
	}
}

func hostBindingFromProto(p *pb.HostBinding) (*nvmegate.HostBinding, error) {
	if p == nil {
		return nil, nvmegate.Invalid("", "is required")
	}
	return &nvmegate.HostBinding{SPIFFEID: p.SpiffeId, HostNQN: p.HostNqn, Tenant: p.Tenant, Subnets: p.Subnets}, nil
}

func hostBindingToProto(h *nvmegate.HostBinding) *pb.HostBinding {
	return &pb.HostBinding{SpiffeId: h.SPIFFEID, HostNqn: h.HostNQN, Tenant: h.Tenant, Subnets: h.Subnets, CreatedAt: ts(h.CreatedAt)}
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
