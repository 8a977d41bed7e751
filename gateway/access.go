package gateway

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	"github.com/nvmegate/nvmegate/lease"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// accessService answers the node calls: it converts proto to domain
// types and back, and leaves the grants' lifecycle to lease. Policy has
// decided that the caller is a node of the job's active scope, with its
// own host binding, for the job's tenant only.
type accessService struct {
	pb.UnimplementedAccessServer
	store InventoryStore
	lease *lease.Lifecycle // nil: Connect and the grant RPCs are not served
	now   func() time.Time
}

// Discover lists where the job's subsystems listen, as a discovery
// controller would: one entry per port of each subsystem, with its
// secure-channel requirement, and the host NQN the node must connect with.
func (s *accessService) Discover(ctx context.Context, r *pb.DiscoverRequest) (*pb.DiscoverResponse, error) {
	sc, ok := scopeFrom(ctx)
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "discover: call has no authorization input")
	}
	if sc.Job == nil {
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "job %q not found", r.JobId)
	}
	out := &pb.DiscoverResponse{HostNqn: sc.Binding.HostNQN}
	seen := map[string]bool{}
	for _, jn := range sc.Job.Namespaces {
		if seen[jn.SubsystemNQN] {
			continue
		}
		seen[jn.SubsystemNQN] = true
		sub, err := s.store.Subsystem(ctx, jn.SubsystemNQN)
		if err != nil {
			return nil, err
		}
		t, err := s.store.Target(ctx, sub.TargetID)
		if err != nil {
			return nil, err
		}
		out.Entries = append(out.Entries, discoveryEntries(sub, t, &sc.Binding)...)
	}
	return out, nil
}

// discoveryEntries are a subsystem's ports as NVMe discovery log entries:
// those the node bound by b reaches from its fabric segment.
func discoveryEntries(sub *nvmegate.Subsystem, t *nvmegate.Target, b *nvmegate.HostBinding) []*pb.DiscoveryEntry {
	nqn := sub.NQN
	var out []*pb.DiscoveryEntry
	for _, pid := range sub.PortIDs {
		for _, p := range t.Ports {
			if p.ID != pid || !b.Reaches(p) {
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
	return out
}

// Connect hands a node the credentials of one subsystem in its job
// (lease.Lifecycle.Issue): policy allowed it (with obligations), the
// credentials are derived for the node's bound host NQN, the target is
// programmed to accept them, and the grant's audit entry is durable —
// only then does the node get them.
func (s *accessService) Connect(ctx context.Context, r *pb.ConnectRequest) (*pb.ConnectResponse, error) {
	if s.lease == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway issues no credentials: it has no key manager or target agent")
	}
	d, ok := authz.DecisionFromContext(ctx)
	sc, ok2 := scopeFrom(ctx)
	if !ok || !ok2 {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "connect: call has no authorization")
	}
	is, err := s.lease.Issue(ctx, lease.Request{Scope: sc, Decision: d, TTL: r.Ttl.AsDuration()})
	if err != nil {
		return nil, err
	}
	return connectResponse(is.Grant, sc.Subsystem, sc.Target, &sc.Binding, is.Credentials, d)
}

func connectResponse(g *nvmegate.Grant, sub *nvmegate.Subsystem, t *nvmegate.Target, b *nvmegate.HostBinding,
	c keys.Credentials, d *nvmegate.Decision) (*pb.ConnectResponse, error) {
	entries := discoveryEntries(sub, t, b)
	conn := nvmefmt.Connection{HostNQN: g.HostNQN, SubsystemNQN: g.SubsystemNQN, DHCHAPKey: c.HostSecret,
		DHCHAPCtrlKey: c.CtrlSecret, TLS: g.TLS, TLSKey: c.TLSPSK}
	if c.TLSPSK != "" {
		// The PSK identity (NVMe TCP 3.6.1.3, v1 with the PSK digest) the
		// host and target derive from the configured PSK.
		k, err := nvmefmt.ParseTLSPSK(c.TLSPSK)
		if err != nil {
			return nil, fmt.Errorf("connect: tls psk: %w", err)
		}
		tc, err := nvmefmt.DeriveTLS(k, g.HostNQN, g.SubsystemNQN)
		if err != nil {
			return nil, fmt.Errorf("connect: tls identity: %w", err)
		}
		conn.TLSKeyIdentity = tc.IdentityV1
	}
	for _, p := range t.Ports {
		// With TLS, the TLS ports; without, the ports that do not require it.
		usable := g.TLS && p.TLS() || !g.TLS && p.SecureChannel != nvmegate.SecureChannelRequired
		if usable && slices.Contains(sub.PortIDs, p.ID) && b.Reaches(p) {
			conn.Ports = append(conn.Ports, nvmefmt.Endpoint{Transport: p.Transport, Address: p.Address, ServiceID: p.ServiceID})
		}
	}
	cfg, err := conn.ConfigJSON()
	if err != nil {
		return nil, fmt.Errorf("connect: config.json: %w", err)
	}
	args, err := conn.ConnectArgs(0)
	if err != nil {
		return nil, fmt.Errorf("connect: nvme connect arguments: %w", err)
	}
	return &pb.ConnectResponse{
		Grant: grantToProto(g, entries),
		Credentials: &pb.Credentials{DhchapHostSecret: c.HostSecret, DhchapCtrlSecret: c.CtrlSecret, TlsPsk: c.TLSPSK, TlsPskIdentity: conn.TLSKeyIdentity,
			KeyVersion: g.KeyVersion, DhchapHash: g.DHCHAPHash, DhchapDhgroup: g.DHGroup},
		ConfigJson: cfg, ConnectArgs: args, Decision: decisionToProto(d),
	}, nil
}

func grantToProto(g *nvmegate.Grant, ports []*pb.DiscoveryEntry) *pb.Grant {
	out := &pb.Grant{GrantId: g.ID, JobId: g.JobID, Tenant: g.Tenant, Node: g.Node, HostNqn: g.HostNQN, SubsystemNqn: g.SubsystemNQN,
		Ports: ports, IssuedAt: ts(g.IssuedAt), ExpiresAt: ts(g.ExpiresAt), KeyVersion: g.KeyVersion, DecisionId: g.DecisionID,
		AuditIndex: g.AuditIndex, ReadOnly: g.ReadOnly, RemovalPending: g.RemovalPending, SupersededBy: g.SupersededBy}
	switch g.State {
	case nvmegate.GrantActive:
		out.State = pb.GrantState_GRANT_STATE_ACTIVE
	case nvmegate.GrantReleased:
		out.State = pb.GrantState_GRANT_STATE_RELEASED
	case nvmegate.GrantRevoked:
		out.State = pb.GrantState_GRANT_STATE_REVOKED
	case nvmegate.GrantExpired:
		out.State = pb.GrantState_GRANT_STATE_EXPIRED
	}
	return out
}

// errGrantNotFound answers a renewal or release of a grant that is not the
// caller's: whether it is another node's or does not exist, the caller
// learns nothing about it — not even that (describe.go callersGrant).
var errGrantNotFound = nvmegate.Errorf(nvmegate.ENOTFOUND, "grant not found")

// ownGrant returns the caller's grant id, if it is active — or, with
// pending set, a grant the node released whose removal from the target is
// still pending (a release retried). A node renews and releases only its
// own grants (describe refused other callers before policy; this checks
// again, with the same answer).
func (s *accessService) ownGrant(ctx context.Context, id string, pending bool) (*nvmegate.Grant, error) {
	if s.lease == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no grants")
	}
	c, ok := authz.CallerFromContext(ctx)
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "grant call has no authorization")
	}
	g, err := s.lease.Grant(ctx, id)
	if nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND || err == nil && g.Node != c.ID {
		return nil, errGrantNotFound
	}
	if err != nil {
		return nil, err
	}
	if !g.Active(s.now()) && !(pending && g.State == nvmegate.GrantReleased && g.RemovalPending) {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "grant %s is no longer active", id)
	}
	return g, nil
}

// Release ends the caller's grant (lease.Lifecycle.Release): the target
// stops allowing the host. It answers only once the target acknowledged
// the removal; a release whose target did not follow is Unavailable, and
// the node may retry it (the grant is released, its removal pending).
func (s *accessService) Release(ctx context.Context, r *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	g, err := s.ownGrant(ctx, r.GrantId, true)
	if err != nil {
		return nil, err
	}
	if err := s.lease.Release(ctx, g); err != nil {
		return nil, err
	}
	return &pb.ReleaseResponse{Grant: grantToProto(g, nil)}, nil
}

// Renew extends the caller's grant and returns its current credentials
// (lease.Lifecycle.Renew): after a rotation the new root's, on the target
// before the answer, under the renewal's own decision and obligations.
func (s *accessService) Renew(ctx context.Context, r *pb.RenewRequest) (*pb.RenewResponse, error) {
	g, err := s.ownGrant(ctx, r.GrantId, false)
	if err != nil {
		return nil, err
	}
	d, ok := authz.DecisionFromContext(ctx)
	sc, ok2 := scopeFrom(ctx)
	if !ok || !ok2 {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "renew: call has no authorization")
	}
	is, err := s.lease.Renew(ctx, g, lease.Request{Scope: sc, Decision: d, TTL: r.Ttl.AsDuration()})
	if err != nil {
		return nil, err
	}
	cr, err := connectResponse(is.Grant, sc.Subsystem, sc.Target, &sc.Binding, is.Credentials, d)
	if err != nil {
		return nil, err
	}
	return &pb.RenewResponse{Grant: cr.Grant, Credentials: cr.Credentials, ConfigJson: cr.ConfigJson, ConnectArgs: cr.ConnectArgs}, nil
}

// ListGrants lists grants by job, node and state (admins).
func (s *accessService) ListGrants(ctx context.Context, r *pb.ListGrantsRequest) (*pb.ListGrantsResponse, error) {
	if s.lease == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no grants")
	}
	state := ""
	switch r.State {
	case pb.GrantState_GRANT_STATE_ACTIVE:
		state = nvmegate.GrantActive
	case pb.GrantState_GRANT_STATE_RELEASED:
		state = nvmegate.GrantReleased
	case pb.GrantState_GRANT_STATE_REVOKED:
		state = nvmegate.GrantRevoked
	case pb.GrantState_GRANT_STATE_EXPIRED:
		state = nvmegate.GrantExpired
	}
	gs, next, err := s.lease.ListGrants(ctx, store.GrantFilter{JobID: r.JobId, Node: r.Node, State: state, RemovalPending: r.RemovalPending},
		store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	out := &pb.ListGrantsResponse{NextPageToken: next}
	for _, g := range gs {
		out.Grants = append(out.Grants, grantToProto(g, nil))
	}
	return out, nil
}

// Revoke ends grants by ID, job or node (admins;
// lease.Lifecycle.Revoke): the targets stop allowing the hosts, and the
// roots they knew rotate.
func (s *accessService) Revoke(ctx context.Context, r *pb.RevokeRequest) (*pb.RevokeResponse, error) {
	if s.lease == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no grants")
	}
	sel := lease.Selection{GrantID: r.GetGrantId(), JobID: r.GetJobId(), Node: r.GetNode()} // one of them (validate.go)
	ids, err := s.lease.Revoke(ctx, sel, callerID(ctx), "revoked: "+r.Reason)
	return &pb.RevokeResponse{RevokedGrantIds: ids}, err
}

// callerID is the SPIFFE ID of the call's caller, as policy saw it ("" if
// the call has none).
func callerID(ctx context.Context) string {
	if in, ok := authz.InputFromContext(ctx); ok {
		return in.Caller.ID
	}
	return ""
}

// SweepExpired ends the grants past their expiry (lease.Lifecycle.Expire)
// and returns how many it ended; a gateway that keeps no grants has none.
func (s *Server) SweepExpired(ctx context.Context) (int, error) {
	if s.lease == nil {
		return 0, nil
	}
	return s.lease.Expire(ctx)
}
