package gateway

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// accessService answers the node calls. Policy has decided that the caller
// is a node of the job's active scope, with its own host binding, for the
// job's tenant only.
type accessService struct {
	pb.UnimplementedAccessServer
	store   InventoryStore
	jobs    JobStore
	grants  GrantStore       // nil: Connect and the grant RPCs are not served
	keys    KeyManager       // derives credentials
	targets TargetProgrammer // programs targets before a grant is handed out
	audit   AuditLog
	now     func() time.Time
	log     *slog.Logger
}

// GrantStore keeps grants.
type GrantStore interface {
	PutGrant(ctx context.Context, g *nvmegate.Grant) error
	PutGrants(ctx context.Context, gs ...*nvmegate.Grant) error
	PutGrantsMoving(ctx context.Context, gs []*nvmegate.Grant, move []string, from *store.HostEntry, to store.HostEntry) error
	SubsystemGrants(ctx context.Context, subsystemNQN string) ([]*nvmegate.Grant, error)
	NodeActiveGrants(ctx context.Context, node string) ([]*nvmegate.Grant, error)
	Grant(ctx context.Context, id string) (*nvmegate.Grant, error)
	ListGrants(ctx context.Context, f store.GrantFilter, p store.Page) ([]*nvmegate.Grant, string, error)
}

// TargetProgrammer makes a target allow exactly the hosts its active
// grants name (targetagent.Agent). Program's changed are the host entries
// whose grants the caller stored a change of (every one, or the target
// does not hear of it until the next whole run); none programs the whole
// target. InventoryChanged says the target's subsystems, namespaces or
// ports changed: its next run is whole.
type TargetProgrammer interface {
	Program(ctx context.Context, targetID string, changed ...targetagent.HostRef) error
	InventoryChanged(targetID string)
}

// DefaultGrantTTL is a grant's lifetime when the node asks for none.
const DefaultGrantTTL = time.Hour

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
		out.Entries = append(out.Entries, discoveryEntries(sub, t)...)
	}
	return out, nil
}

// discoveryEntries are a subsystem's ports as NVMe discovery log entries.
func discoveryEntries(sub *nvmegate.Subsystem, t *nvmegate.Target) []*pb.DiscoveryEntry {
	nqn := sub.NQN
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
	return out
}

// Connect hands a node the credentials of one subsystem in its job: policy
// allowed it (with obligations), the credentials are derived for the
// node's bound host NQN, the target is programmed to accept them, and the
// grant's audit entry is durable — only then does the node get them. Any
// failure on the way ends the grant before anything is returned.
func (s *accessService) Connect(ctx context.Context, r *pb.ConnectRequest) (*pb.ConnectResponse, error) {
	if s.grants == nil || s.keys == nil || s.targets == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway issues no credentials: it has no key manager or target agent")
	}
	in, ok := authz.InputFromContext(ctx)
	d, ok2 := authz.DecisionFromContext(ctx)
	sc, ok3 := scopeFrom(ctx)
	if !ok || !ok2 || !ok3 {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "connect: call has no authorization")
	}
	// The records policy decided on, read once (describe.go).
	j, sub, t := sc.Job, sc.Subsystem, sc.Target
	switch {
	case j == nil:
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "job %q not found", r.JobId)
	case sub == nil:
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "subsystem %q not found", r.SubsystemNqn)
	case t == nil:
		return nil, nvmegate.Errorf(nvmegate.ENOTFOUND, "target %q not found", sub.TargetID)
	}
	now := s.now()
	g := &nvmegate.Grant{ID: newGrantID(), JobID: j.ID, Tenant: j.Tenant, Node: in.Caller.ID,
		HostNQN: sc.Binding.HostNQN, SubsystemNQN: sub.NQN, IssuedAt: now,
		ExpiresAt: grantExpiry(now, r.Ttl.AsDuration(), d.Obligations.MaxTTL, j.ExpiresAt), State: nvmegate.GrantActive,
		DecisionID: d.ID, ReadOnly: d.Obligations.ReadOnly, KeyScope: nvmegate.CredentialScope(t, sub)}
	if err := grantAuth(g, sub, t, d.Obligations); err != nil {
		return nil, err
	}
	// One grant per node, job and subsystem: a new connect supersedes the
	// node's earlier grant (its credentials are replaced on the target),
	// in the same commit. The node's grants that share this host entry:
	// g asks for the strongest authentication among them, and they move
	// with it below.
	superseded, sibs, err := s.nodeGrants(ctx, g)
	if err != nil {
		return nil, err
	}
	p, err := targetagent.GrantParams(g)
	if err != nil {
		return nil, err
	}
	creds, err := s.keys.Credentials(ctx, g.HostNQN, g.Scope(), p)
	if err != nil {
		return nil, keyErr(err)
	}
	g.KeyVersion = creds.RootVersion
	changed := []*nvmegate.Grant{g}
	for _, o := range superseded {
		o.State = nvmegate.GrantReleased
		changed = append(changed, o)
	}
	moving := differing(sibs, g)
	// The grant is on the record before anything changes: store, target.
	e := grantEntry(in, d, g, creds)
	e.Detail += movedDetail(moving)
	idx, _, err := s.audit.Append(ctx, e)
	if err != nil {
		s.log.ErrorContext(ctx, "connect: grant not recorded; none made", "grant", g.ID, "err", err)
		return nil, errAuditUnavailable
	}
	g.AuditIndex = idx
	if j.State != nvmegate.JobActive {
		// Finished between the policy decision and now.
		s.recordFailure(ctx, in, d, g, "job "+j.ID+" is "+j.State)
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "job %s is %s; no grant", j.ID, j.State)
	}
	if err := s.grants.PutGrantsMoving(ctx, changed, ids(moving), nil, store.EntryOf(g)); err != nil {
		s.recordFailure(ctx, in, d, g, "grant not stored")
		return nil, err
	}
	// Every host entry the commit changed: g's, those it supersedes (on
	// the same subsystem, or another host NQN if the node's binding
	// changed), those that moved with it (its host on the target's other
	// subsystems).
	touched := append(changed, moving...)
	if err := s.targets.Program(ctx, t.ID, targetagent.HostsOf(touched...)...); err != nil {
		s.log.ErrorContext(ctx, "connect: target not programmed; no grant", "target", t.ID, "grant", g.ID, "err", err)
		// The node keeps its other grants at the keys it holds.
		s.putBack(ctx, g, moving)
		s.endGrant(ctx, g, t.ID, nvmegate.GrantRevoked, touched...)
		s.recordFailure(ctx, in, d, g, "target "+t.ID+" did not accept the host")
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "target %s did not accept the host in time; no grant was made", t.ID)
	}
	return s.connectResponse(ctx, g, sub, t, creds, d)
}

// nodeGrants reads the node's active grants once and returns those g
// supersedes (same job and subsystem) and those that share g's host entry:
// the same host NQN in the same key scope (on nvmet one entry per host per
// target, on SPDK per subsystem), in any job, whose root is still usable
// (one past its grace was cut off and stays so). The target holds one set
// of credentials for a host entry, so g asks for the strongest
// authentication any of the sharing grants needs — obligations are
// minimums: a stronger hash or DH group, or bidirectional authentication,
// satisfies a weaker one — and they move with g to its root version and
// authentication. Only a TLS/DH-HMAC-CHAP mismatch cannot be merged.
func (s *accessService) nodeGrants(ctx context.Context, g *nvmegate.Grant) (superseded, sharing []*nvmegate.Grant, err error) {
	all, err := s.grants.NodeActiveGrants(ctx, g.Node)
	if err != nil {
		return nil, nil, err
	}
	now := s.now()
	for _, o := range all {
		switch {
		case o.ID == g.ID:
			continue
		case o.JobID == g.JobID && o.SubsystemNQN == g.SubsystemNQN:
			superseded = append(superseded, o)
			continue
		case !o.Active(now) || o.HostNQN != g.HostNQN || o.Scope() != g.Scope():
			continue
		}
		if err := s.keys.Usable(ctx, g.Scope(), o.KeyVersion); errors.Is(err, keys.ErrExpired) {
			continue
		} else if err != nil {
			return nil, nil, keyErr(err)
		}
		if o.TLS != g.TLS || (o.DHCHAPHash == "none") != (g.DHCHAPHash == "none") {
			return nil, nil, nvmegate.Errorf(nvmegate.ECONFLICT,
				"host %s holds grant %s (subsystem %s) secured by %s, this one by %s; the target keeps one set of credentials per host: release that grant first",
				g.HostNQN, o.ID, o.SubsystemNQN, security(o), security(g))
		}
		sharing = append(sharing, o)
	}
	for _, o := range sharing {
		g.DHCHAPHash = stronger(hashRank, g.DHCHAPHash, o.DHCHAPHash)
		g.DHGroup = stronger(groupRank, g.DHGroup, o.DHGroup)
		g.Bidirectional = g.Bidirectional || o.Bidirectional
	}
	return superseded, sharing, nil
}

func security(g *nvmegate.Grant) string {
	switch {
	case g.TLS && g.DHCHAPHash == "none":
		return "TLS"
	case g.TLS:
		return "TLS and DH-HMAC-CHAP"
	}
	return "DH-HMAC-CHAP"
}

var (
	hashRank  = map[string]int{"sha256": 1, "sha384": 2, "sha512": 3}
	groupRank = map[string]int{"null": 0, "ffdhe2048": 1, "ffdhe3072": 2, "ffdhe4096": 3, "ffdhe6144": 4, "ffdhe8192": 5}
)

// stronger is the stronger of a and b by rank (a if either is unranked).
func stronger(rank map[string]int, a, b string) string {
	ra, oka := rank[a]
	rb, okb := rank[b]
	if oka && okb && rb > ra {
		return b
	}
	return a
}

// differing returns the grants whose host entry (root version and
// authentication) is not g's: those a change of g moves.
func differing(gs []*nvmegate.Grant, g *nvmegate.Grant) []*nvmegate.Grant {
	var out []*nvmegate.Grant
	for _, o := range gs {
		if store.EntryOf(o) != store.EntryOf(g) {
			out = append(out, o)
		}
	}
	return out
}

// putBack returns the grants moved with g to where they were (before
// holds them as read before the move), each only while it still has g's
// entry (a later move stays).
func (s *accessService) putBack(ctx context.Context, g *nvmegate.Grant, before []*nvmegate.Grant) {
	ctx = context.WithoutCancel(ctx)
	moved := store.EntryOf(g)
	for _, b := range before {
		if err := s.grants.PutGrantsMoving(ctx, nil, []string{b.ID}, &moved, store.EntryOf(b)); err != nil {
			s.log.ErrorContext(ctx, "a grant sharing the host entry was not put back", "grant", b.ID, "with", g.ID, "err", err)
		}
	}
}

func ids(gs []*nvmegate.Grant) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.ID
	}
	return out
}

// movedDetail says in an entry which other grants moved with it.
func movedDetail(moved []*nvmegate.Grant) string {
	if len(moved) == 0 {
		return ""
	}
	return "; moves " + strings.Join(ids(moved), ", ") + " to this root version and authentication (one host entry on the target)"
}

// grantExpiry is now+ttl (DefaultGrantTTL if 0), capped by the policy's
// max TTL and the job's expiry.
func grantExpiry(now time.Time, ttl, maxTTL time.Duration, jobExpiry time.Time) time.Time {
	if ttl <= 0 {
		ttl = DefaultGrantTTL
	}
	if maxTTL > 0 && ttl > maxTTL {
		ttl = maxTTL
	}
	exp := now.Add(ttl)
	if jobExpiry.Before(exp) {
		exp = jobExpiry
	}
	return exp
}

// grantAuth sets g's authentication from the obligations and refuses what
// g's target cannot enforce: the nvmet driver authenticates hosts with
// DH-HMAC-CHAP only (it installs no TLS PSK), so a grant that relies on
// TLS would be open there.
func grantAuth(g *nvmegate.Grant, sub *nvmegate.Subsystem, t *nvmegate.Target, ob nvmegate.Obligations) error {
	if err := grantCredentialParams(g, sub, ob); err != nil {
		return err
	}
	if t.Driver == nvmegate.DriverNVMet && (g.TLS || g.DHCHAPHash == "none") {
		return nvmegate.Errorf(nvmegate.ECONFLICT, "policy requires TLS for %s, which its nvmet target cannot enforce; not granted", sub.NQN)
	}
	return nil
}

// grantCredentialParams fills the grant's credential settings from the
// obligations and what the subsystem supports.
func grantCredentialParams(g *nvmegate.Grant, sub *nvmegate.Subsystem, ob nvmegate.Obligations) error {
	g.DHCHAPHash, g.DHGroup = ob.MinHash, ob.MinDHGroup
	if g.DHCHAPHash == "" {
		g.DHCHAPHash = "sha256"
	}
	if g.DHGroup == "" {
		g.DHGroup = "ffdhe2048"
	}
	g.Bidirectional = ob.Bidirectional
	wantTLS := ob.RequireTLS || ob.AuthMode == nvmegate.AuthTLS || ob.AuthMode == nvmegate.AuthBoth
	if wantTLS && !sub.TLS {
		return nvmegate.Errorf(nvmegate.ECONFLICT, "policy requires TLS but subsystem %s has no TLS port", sub.NQN)
	}
	if !sub.DHCHAP && ob.AuthMode != nvmegate.AuthTLS {
		return nvmegate.Errorf(nvmegate.ECONFLICT, "subsystem %s does not do DH-HMAC-CHAP", sub.NQN)
	}
	g.TLS = wantTLS
	if !sub.DHCHAP || ob.AuthMode == nvmegate.AuthTLS {
		// TLS only: no DH-HMAC-CHAP secrets at all.
		g.DHCHAPHash, g.DHGroup, g.Bidirectional = "none", "", false
	}
	return nil
}

func newGrantID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "g-" + base64.RawURLEncoding.EncodeToString(b)
}

// endGrant ends a grant and reprograms its target for it and the other
// grants also changed (best effort: the reconciler retries).
func (s *accessService) endGrant(ctx context.Context, g *nvmegate.Grant, targetID, state string, also ...*nvmegate.Grant) {
	ctx = context.WithoutCancel(ctx)
	g.State = state
	if err := s.grants.PutGrant(ctx, g); err != nil {
		s.log.ErrorContext(ctx, "grant not ended in the store", "grant", g.ID, "err", err)
	}
	if err := s.targets.Program(ctx, targetID, targetagent.HostsOf(append([]*nvmegate.Grant{g}, also...)...)...); err != nil {
		s.log.ErrorContext(ctx, "target not reprogrammed after a grant ended", "target", targetID, "err", err)
	}
}

// recordFailure appends a deny entry for a connect that policy allowed but
// that failed on the way (best effort: the caller is refused anyway).
func (s *accessService) recordFailure(ctx context.Context, in *authz.Input, d *nvmegate.Decision, g *nvmegate.Grant, why string) {
	e := entryFor(in, d, audit.EventDeny)
	e.Time, e.GrantID, e.Detail = s.now(), g.ID, e.Detail+": "+why
	if _, _, err := s.audit.Append(context.WithoutCancel(ctx), e); err != nil {
		s.log.ErrorContext(ctx, "connect failure not recorded", "grant", g.ID, "err", err)
	}
}

// grantEntry is the audit entry of a grant: versions and fingerprints of
// what was issued, never the secrets.
func grantEntry(in *authz.Input, d *nvmegate.Decision, g *nvmegate.Grant, c keys.Credentials) audit.Entry {
	e := entryFor(in, d, audit.EventGrant)
	e.Time, e.GrantID, e.ExpiresAt, e.HostNQN, e.SubsystemNQN = g.IssuedAt, g.ID, g.ExpiresAt, g.HostNQN, g.SubsystemNQN
	e.Detail = fmt.Sprintf("access.connect %s", g.SubsystemNQN)
	e.Keys = []audit.KeyRef{{Class: "access_root", ID: g.Scope(), Version: g.KeyVersion, Fingerprint: c.RootFingerprint}}
	for _, k := range []struct{ class, fp string }{
		{"dhchap_host", c.HostSecretFingerprint}, {"dhchap_ctrl", c.CtrlSecretFingerprint}, {"tls_psk", c.TLSPSKFingerprint},
	} {
		if k.fp != "" {
			e.Keys = append(e.Keys, audit.KeyRef{Class: k.class, ID: g.HostNQN, Version: g.KeyVersion, Fingerprint: k.fp})
		}
	}
	return e
}

func (s *accessService) connectResponse(ctx context.Context, g *nvmegate.Grant, sub *nvmegate.Subsystem, t *nvmegate.Target,
	c keys.Credentials, d *nvmegate.Decision) (*pb.ConnectResponse, error) {
	entries := discoveryEntries(sub, t)
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
		if usable && slices.Contains(sub.PortIDs, p.ID) {
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
		AuditIndex: g.AuditIndex, ReadOnly: g.ReadOnly}
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

// ownGrant returns the caller's active grant id: a node renews and
// releases only its own grants (policy has checked the job scope; this is
// the grant's owner).
func (s *accessService) ownGrant(ctx context.Context, id string) (*nvmegate.Grant, error) {
	if s.grants == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no grants")
	}
	c, ok := authz.CallerFromContext(ctx)
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "grant call has no authorization")
	}
	g, err := s.grants.Grant(ctx, id)
	if err != nil {
		return nil, err
	}
	if g.Node != c.ID {
		return nil, nvmegate.Errorf(nvmegate.EPERMISSION, "grant %s is not the caller's", id)
	}
	if !g.Active(s.now()) {
		return nil, nvmegate.Errorf(nvmegate.ECONFLICT, "grant %s is no longer active", id)
	}
	return g, nil
}

// targetOf is the target of a grant's subsystem.
func (s *accessService) targetOf(ctx context.Context, g *nvmegate.Grant) (*nvmegate.Subsystem, *nvmegate.Target, error) {
	sub, err := s.store.Subsystem(ctx, g.SubsystemNQN)
	if err != nil {
		return nil, nil, err
	}
	t, err := s.store.Target(ctx, sub.TargetID)
	return sub, t, err
}

// Release ends the caller's grant: the target stops allowing the host.
func (s *accessService) Release(ctx context.Context, r *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	g, err := s.ownGrant(ctx, r.GrantId)
	if err != nil {
		return nil, err
	}
	_, t, err := s.targetOf(ctx, g)
	if err != nil {
		return nil, err
	}
	s.endGrant(ctx, g, t.ID, nvmegate.GrantReleased)
	return &pb.ReleaseResponse{Grant: grantToProto(g, nil)}, nil
}

// Renew extends the caller's grant (within policy's caps and the job's
// expiry) and returns the current credentials: after a rotation, the new
// root's, with the target reprogrammed before the answer. The renewal is
// a new decision: its obligations apply in full (a class now obliging a
// stronger hash, a DH group, bidirectional authentication, TLS or
// read-only changes the grant and its credentials, as a connect would).
func (s *accessService) Renew(ctx context.Context, r *pb.RenewRequest) (*pb.RenewResponse, error) {
	g, err := s.ownGrant(ctx, r.GrantId)
	if err != nil {
		return nil, err
	}
	in, _ := authz.InputFromContext(ctx)
	d, _ := authz.DecisionFromContext(ctx)
	j, err := s.jobs.Job(ctx, g.JobID)
	if err != nil {
		return nil, err
	}
	sub, t, err := s.targetOf(ctx, g)
	if err != nil {
		return nil, err
	}
	prev := *g
	g.ReadOnly = d.Obligations.ReadOnly
	if err := grantAuth(g, sub, t, d.Obligations); err != nil {
		return nil, err
	}
	_, sibs, err := s.nodeGrants(ctx, g)
	if err != nil {
		return nil, err
	}
	p, err := targetagent.GrantParams(g)
	if err != nil {
		return nil, err
	}
	creds, err := s.keys.Credentials(ctx, g.HostNQN, g.Scope(), p)
	if err != nil {
		return nil, keyErr(err)
	}
	now := s.now()
	g.KeyVersion, g.ExpiresAt, g.DecisionID = creds.RootVersion, grantExpiry(now, r.Ttl.AsDuration(), d.Obligations.MaxTTL, j.ExpiresAt), d.ID
	// The node's grants that share this host entry move with it.
	moving := differing(sibs, g)
	// On the record before the store or the target changes.
	e := grantEntry(in, d, g, creds)
	e.Kind, e.Time, e.Detail = audit.EventRenew, now, "access.renew "+g.SubsystemNQN+movedDetail(moving)
	idx, _, err := s.audit.Append(ctx, e)
	if err != nil {
		return nil, errAuditUnavailable
	}
	g.AuditIndex = idx
	if err := s.grants.PutGrantsMoving(ctx, []*nvmegate.Grant{g}, ids(moving), nil, store.EntryOf(g)); err != nil {
		return nil, err // e.g. revoked meanwhile: ended grants stay ended
	}
	if len(moving) > 0 || store.EntryOf(g) != store.EntryOf(&prev) || g.TLS != prev.TLS || g.ReadOnly != prev.ReadOnly {
		touched := targetagent.HostsOf(append([]*nvmegate.Grant{g}, moving...)...)
		if err := s.targets.Program(ctx, t.ID, touched...); err != nil {
			s.log.ErrorContext(ctx, "renew: target not reprogrammed; grant kept at its old keys", "grant", g.ID, "err", err)
			if perr := s.grants.PutGrant(context.WithoutCancel(ctx), &prev); perr != nil {
				s.log.ErrorContext(ctx, "renew: old keys not restored", "grant", g.ID, "err", perr)
			}
			s.putBack(ctx, g, moving)
			// The target follows the store back (best effort: the
			// reconciler retries).
			if perr := s.targets.Program(context.WithoutCancel(ctx), t.ID, touched...); perr != nil {
				s.log.ErrorContext(ctx, "renew: target not reprogrammed to the old keys", "target", t.ID, "err", perr)
			}
			s.recordFailure(ctx, in, d, g, "target "+t.ID+" did not accept the new keys")
			return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "target %s did not accept the new keys; the grant keeps its old ones", t.ID)
		}
	}
	cr, err := s.connectResponse(ctx, g, sub, t, creds, d)
	if err != nil {
		return nil, err
	}
	return &pb.RenewResponse{Grant: cr.Grant, Credentials: cr.Credentials, ConfigJson: cr.ConfigJson, ConnectArgs: cr.ConnectArgs}, nil
}

// ListGrants lists grants by job, node and state (admins).
func (s *accessService) ListGrants(ctx context.Context, r *pb.ListGrantsRequest) (*pb.ListGrantsResponse, error) {
	if s.grants == nil {
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
	gs, next, err := s.grants.ListGrants(ctx, store.GrantFilter{JobID: r.JobId, Node: r.Node, State: state},
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

// Revoke ends grants by ID, job or node (admins): the targets stop
// allowing the hosts, and the roots they knew rotate.
func (s *accessService) Revoke(ctx context.Context, r *pb.RevokeRequest) (*pb.RevokeResponse, error) {
	if s.grants == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway keeps no grants")
	}
	var gs []*nvmegate.Grant
	switch sel := r.Selector.(type) {
	case *pb.RevokeRequest_GrantId:
		g, err := s.grants.Grant(ctx, sel.GrantId)
		if err != nil {
			return nil, err
		}
		if g.State == nvmegate.GrantActive {
			gs = append(gs, g)
		}
	default:
		f := store.GrantFilter{State: nvmegate.GrantActive, JobID: r.GetJobId(), Node: r.GetNode()}
		var err error
		if gs, err = store.All(func(p store.Page) ([]*nvmegate.Grant, string, error) { return s.grants.ListGrants(ctx, f, p) }); err != nil {
			return nil, err
		}
	}
	out := &pb.RevokeResponse{}
	n, err := s.revokeGrants(ctx, gs, "revoked: "+r.Reason)
	out.RevokedGrantIds = n
	return out, err
}

// revokeGrants ends grants, reprograms their targets and rotates the roots
// of their subsystems (what the hosts knew stops working after the grace).
// Each grant gets its own revoke entry — its job, host and subsystem —
// before it is ended: the call's entry names only what was asked (a node,
// a job, an ID), and auditors follow a job's grants. Ending access is the
// safe direction, so a grant whose entry cannot be written is ended all
// the same (the call's own entry, written before, stands for it), and a
// revocation once begun runs to its end even if the caller hangs up.
func (s *accessService) revokeGrants(ctx context.Context, gs []*nvmegate.Grant, why string) ([]string, error) {
	ctx = context.WithoutCancel(ctx)
	targets := map[string][]targetagent.HostRef{} // the host entries ended, by target
	scopes := map[string]bool{}
	var ids []string
	var errs []error
	caller := ""
	if in, ok := authz.InputFromContext(ctx); ok {
		caller = in.Caller.ID
	}
	// Appended together, the entries share commits.
	var wg sync.WaitGroup
	for _, g := range gs {
		wg.Go(func() {
			e := audit.Entry{Kind: audit.EventRevoke, Time: s.now(), JobID: g.JobID, Tenant: g.Tenant, Caller: caller,
				HostNQN: g.HostNQN, SubsystemNQN: g.SubsystemNQN, GrantID: g.ID, ExpiresAt: g.ExpiresAt, Detail: why}
			if _, _, err := s.audit.Append(ctx, e); err != nil {
				s.log.ErrorContext(ctx, "revoke entry not recorded; the grant is ended all the same", "grant", g.ID, "err", err)
			}
		})
	}
	wg.Wait()
	for _, g := range gs {
		g.State = nvmegate.GrantRevoked
	}
	failed := map[string]bool{}
	if err := s.grants.PutGrants(ctx, gs...); err != nil {
		// One commit failed: end them one by one, so that one bad grant
		// (ended meanwhile, say) does not keep the others.
		for _, g := range gs {
			if err := s.grants.PutGrant(ctx, g); err != nil && nvmegate.ErrorCode(err) != nvmegate.ECONFLICT {
				errs = append(errs, fmt.Errorf("grant %s: %w", g.ID, err))
				failed[g.ID] = true
			}
		}
	}
	for _, g := range gs {
		if failed[g.ID] {
			continue
		}
		ids = append(ids, g.ID)
		scopes[g.Scope()] = true
		if _, t, err := s.targetOf(ctx, g); err == nil {
			targets[t.ID] = append(targets[t.ID], targetagent.HostOf(g))
		}
	}
	// For every grant that ended, whatever else failed: the targets drop
	// the hosts, and the roots the hosts knew rotate.
	for t, hosts := range targets {
		if err := s.targets.Program(ctx, t, hosts...); err != nil {
			errs = append(errs, err)
		}
	}
	if s.keys != nil {
		for sc := range scopes {
			if err := s.keys.Revoked(ctx, sc, why); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.ErrorContext(ctx, "revocation incomplete; the reconciler and the scheduled rotation retry", "err", err)
		return ids, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "revoked %d grant(s), but a target or a key store did not follow; it is retried", len(ids))
	}
	return ids, nil
}

// endJobGrants revokes a finished job's active grants.
func (s *accessService) endJobGrants(ctx context.Context, jobID, why string) ([]string, error) {
	f := store.GrantFilter{JobID: jobID, State: nvmegate.GrantActive}
	gs, err := store.All(func(p store.Page) ([]*nvmegate.Grant, string, error) { return s.grants.ListGrants(ctx, f, p) })
	if err != nil {
		return nil, err
	}
	return s.revokeGrants(ctx, gs, why)
}

// GrantSweeper ends expired grants.
type GrantSweeper interface {
	ExpiredGrants(ctx context.Context) ([]*nvmegate.Grant, error)
}

// SweepExpired ends the grants past their expiry: each is recorded
// (expire) and stored as expired, and its target reprogrammed (the
// reconciler would drop the host anyway; this makes it a fact in the
// store and the log). It returns how many it ended.
func (s *Server) SweepExpired(ctx context.Context) (int, error) {
	as := s.access
	if as == nil || as.grants == nil {
		return 0, nil
	}
	sw, ok := as.grants.(GrantSweeper)
	if !ok {
		return 0, nil
	}
	gs, err := sw.ExpiredGrants(ctx)
	if err != nil {
		return 0, err
	}
	targets := map[string][]targetagent.HostRef{} // the host entries ended, by target
	ended := 0
	defer func() {
		for t, hosts := range targets {
			if err := as.targets.Program(ctx, t, hosts...); err != nil {
				s.log.WarnContext(ctx, "target not reprogrammed after expiry; the reconciler retries", "target", t, "err", err)
			}
		}
	}()
	for _, g := range gs {
		e := audit.Entry{Kind: audit.EventExpire, Time: s.now(), JobID: g.JobID, Tenant: g.Tenant, Caller: "", HostNQN: g.HostNQN,
			SubsystemNQN: g.SubsystemNQN, GrantID: g.ID, ExpiresAt: g.ExpiresAt, Detail: "grant expired"}
		if _, _, err := s.audit.Append(ctx, e); err != nil {
			return ended, err // not ended unrecorded; the next sweep retries
		}
		g.State = nvmegate.GrantExpired
		if err := as.grants.PutGrant(ctx, g); err != nil {
			return ended, err
		}
		ended++
		if _, t, err := as.targetOf(ctx, g); err == nil {
			targets[t.ID] = append(targets[t.ID], targetagent.HostOf(g))
		}
	}
	return ended, nil
}
