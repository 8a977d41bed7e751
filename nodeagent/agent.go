package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	"github.com/nvmegate/nvmegate/nvmehost"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Gateway is the part of the Access service the agent calls
// (pb.AccessClient is one).
type Gateway interface {
	Discover(ctx context.Context, in *pb.DiscoverRequest, opts ...grpc.CallOption) (*pb.DiscoverResponse, error)
	Connect(ctx context.Context, in *pb.ConnectRequest, opts ...grpc.CallOption) (*pb.ConnectResponse, error)
	Renew(ctx context.Context, in *pb.RenewRequest, opts ...grpc.CallOption) (*pb.RenewResponse, error)
	Release(ctx context.Context, in *pb.ReleaseRequest, opts ...grpc.CallOption) (*pb.ReleaseResponse, error)
}

// Kernel is the host's NVMe-oF stack (nvmehost.Host is one).
type Kernel interface {
	Connect(opts string) (nvmehost.Controller, error)
	SetDHCHAP(name, hostSecret, ctrlSecret string) error
	Delete(name string) error
	Info(name string) (nvmehost.Info, error)
	Controllers() ([]nvmehost.Info, error)
	Multipath() bool
	Namespaces(name string) ([]string, error)
}

// Keys is the node's keyring for TLS PSKs (a keyring.Ring).
type Keys interface {
	ID() int
	Set(desc string, payload []byte) (int, error)
	Remove(desc string) error
}

// Agent connects one node to one job's subsystems and keeps them keyed.
type Agent struct {
	Gateway Gateway
	Kernel  Kernel
	// Keys holds the TLS PSKs; nil refuses TLS grants.
	Keys Keys
	Job  string
	// Subsystems, when set, are the only subsystems of the job the agent
	// connects (a CSI volume is one namespace of one subsystem); each must
	// be one the job gives this node.
	Subsystems []string
	// TTL asked for each grant; 0 is the gateway's default.
	TTL time.Duration
	// RenewEvery is how often grants are renewed (a rotation reaches the
	// node at its next renewal, so it must be shorter than the gateway's
	// rotation grace); capped at a third of the shortest grant's lifetime.
	// 0 is one minute.
	RenewEvery time.Duration
	// PathWait bounds the wait for a new path's namespaces at a re-key
	// by a new path; 0 is ten seconds.
	PathWait time.Duration
	Log      *slog.Logger
	Now      func() time.Time // time.Now if nil

	mu      sync.Mutex
	hostNQN string
	subs    map[string]*sub // by subsystem NQN
	started time.Time
}

// sub is one subsystem of the job: its grant, controller and credentials.
type sub struct {
	nqn        string
	grant      *pb.Grant // no secrets
	conn       nvmefmt.Connection
	ctrl       string // controller name; "" when not connected
	pskDesc    string // the PSK's description in Keys; "" without TLS
	lifetime   time.Duration
	lastRenew  time.Time
	lastRekey  time.Time
	rekeys     int
	lastErr    string
	errCode    codes.Code // the gateway's, when lastErr is its refusal
	errorSince time.Time
}

func (a *Agent) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

func (a *Agent) log() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.New(slog.DiscardHandler)
}

// ErrJobEnded reports that every grant of the job ended on the gateway's
// side (revoked, expired, the job finished): the agent disconnected and
// has nothing left to do.
var ErrJobEnded = errors.New("nodeagent: the job's grants ended")

// ErrNotGranted reports that the job gives this node none of the
// subsystems asked for (the node is not in the job, or the subsystem not
// in its scope).
var ErrNotGranted = errors.New("nodeagent: not granted")

// Run connects the job's subsystems, then renews and re-keys them until
// ctx ends (then it disconnects and releases everything) or the job's
// grants end (ErrJobEnded). A discovery the gateway refuses ends Run at
// once; a subsystem that fails to connect is retried at each renewal.
func (a *Agent) Run(ctx context.Context) error {
	if a.Job == "" {
		return errors.New("nodeagent: no job")
	}
	if err := a.start(ctx); err != nil {
		return err
	}
	for {
		wait := a.interval()
		select {
		case <-ctx.Done():
			return a.shutdown()
		case <-time.After(wait):
		}
		if a.tick(ctx) {
			a.log().Info("the job's grants ended; disconnected", "job", a.Job)
			return ErrJobEnded
		}
	}
}

// start discovers the job's subsystems and connects each.
func (a *Agent) start(ctx context.Context) error {
	resp, err := a.Gateway.Discover(ctx, &pb.DiscoverRequest{JobId: a.Job})
	if err != nil {
		return fmt.Errorf("nodeagent: discover job %s: %w", a.Job, err)
	}
	var nqns []string
	for _, e := range resp.Entries {
		if !slices.Contains(nqns, e.Subnqn) {
			nqns = append(nqns, e.Subnqn)
		}
	}
	if len(nqns) == 0 {
		return fmt.Errorf("%w: job %s gives this node no subsystem", ErrNotGranted, a.Job)
	}
	if len(a.Subsystems) > 0 {
		for _, n := range a.Subsystems {
			if !slices.Contains(nqns, n) {
				return fmt.Errorf("%w: job %s gives this node no subsystem %s", ErrNotGranted, a.Job, n)
			}
		}
		nqns = slices.Clone(a.Subsystems)
	}
	a.mu.Lock()
	a.hostNQN, a.subs, a.started = resp.HostNqn, map[string]*sub{}, a.now()
	for _, n := range nqns {
		a.subs[n] = &sub{nqn: n}
	}
	a.mu.Unlock()
	for _, n := range nqns {
		if err := a.connect(ctx, a.subs[n]); err != nil {
			a.fail(a.subs[n], err)
		}
	}
	return nil
}

func (a *Agent) fail(s *sub, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if s.lastErr == "" {
		s.errorSince = a.now()
	}
	s.lastErr = err.Error()
	s.errCode = codes.Unknown
	if st, ok := status.FromError(err); ok {
		s.errCode = st.Code()
	}
	a.log().Error("subsystem", "subsystem", s.nqn, "err", err)
}

func (a *Agent) ok(s *sub) {
	a.mu.Lock()
	s.lastErr, s.errCode, s.errorSince = "", codes.OK, time.Time{}
	a.mu.Unlock()
}

// connect takes a grant for s and connects it through the kernel. A grant
// the kernel could not use is released again: no grant is left open for
// a connection that did not happen.
func (a *Agent) connect(ctx context.Context, s *sub) error {
	req := &pb.ConnectRequest{JobId: a.Job, SubsystemNqn: s.nqn, HostNqn: a.hostNQN}
	if a.TTL > 0 {
		req.Ttl = durationpb.New(a.TTL)
	}
	resp, err := a.Gateway.Connect(ctx, req)
	if err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	conn, err := connection(resp.Grant, resp.Credentials)
	if err == nil {
		err = a.attach(s, resp.Grant, conn)
	}
	if err != nil {
		if _, rerr := a.Gateway.Release(ctx, &pb.ReleaseRequest{GrantId: resp.Grant.GetGrantId()}); rerr != nil {
			err = fmt.Errorf("%w; and releasing the unused grant %s: %v", err, resp.Grant.GetGrantId(), rerr)
		}
		return err
	}
	a.ok(s)
	a.log().Info("connected", "subsystem", s.nqn, "grant", resp.Grant.GrantId, "controller", s.ctrl,
		"key_version", resp.Grant.KeyVersion, "tls", conn.TLS, "expires", resp.Grant.ExpiresAt.AsTime())
	return nil
}

// attach installs the PSK and connects the controller for a new grant.
func (a *Agent) attach(s *sub, g *pb.Grant, conn nvmefmt.Connection) error {
	desc, err := a.putPSK(conn)
	if err != nil {
		return err
	}
	ctrl, adopted, err := a.adopt(conn)
	if err == nil && ctrl == "" {
		ctrl, err = a.kernelConnect(conn, false)
	}
	if err != nil {
		a.dropPSK(desc)
		return err
	}
	if adopted != "" {
		a.log().Info("took over a live controller", "subsystem", s.nqn, "controller", ctrl, "how", adopted)
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	s.grant, s.conn, s.ctrl, s.pskDesc = g, conn, ctrl, desc
	s.lifetime, s.lastRenew = g.ExpiresAt.AsTime().Sub(now), now
	return nil
}

// adopt finds a controller of this host to conn's subsystem that is
// already there (an agent that restarted after a crash left it) and hands
// it the grant's secrets: the connection lives on, and the kernel would
// refuse a second one to the same port anyway. "" if there is none.
func (a *Agent) adopt(conn nvmefmt.Connection) (ctrl, how string, err error) {
	cs, err := a.Kernel.Controllers()
	if err != nil {
		return "", "", err
	}
	for _, c := range cs {
		if c.SubNQN != conn.SubsystemNQN || c.HostNQN != conn.HostNQN || c.State == "deleting" || c.State == "dead" {
			continue
		}
		r, err := a.rekey(c.Name, conn)
		if err != nil {
			return "", "", err
		}
		return r.ctrl, r.how, nil
	}
	return "", "", nil
}

// kernelConnect tries the grant's ports in order until one connects;
// duplicate adds a controller beside a live one (a second path).
func (a *Agent) kernelConnect(conn nvmefmt.Connection, duplicate bool) (string, error) {
	ring := 0
	if a.Keys != nil {
		ring = a.Keys.ID()
	}
	var errs []error
	for i, p := range conn.Ports {
		opts, err := conn.KernelOptions(i, ring, duplicate)
		if err != nil {
			return "", err
		}
		c, err := a.Kernel.Connect(opts)
		if err == nil {
			return c.Name, nil
		}
		errs = append(errs, fmt.Errorf("%s:%s: %w", p.Address, p.ServiceID, err))
	}
	return "", fmt.Errorf("connect: %w", errors.Join(errs...))
}

// putPSK installs conn's TLS PSK under the identity the kernel looks up
// at every (re)connect (v0: "NVMe0R<hh> <hostnqn> <subnqn>", no digest,
// so a rotated PSK replaces the one before it under the same name).
func (a *Agent) putPSK(conn nvmefmt.Connection) (string, error) {
	if !conn.TLS {
		return "", nil
	}
	if a.Keys == nil {
		return "", errors.New("the grant requires TLS and this node has no keyring for PSKs")
	}
	k, err := nvmefmt.ParseTLSPSK(conn.TLSKey)
	if err != nil {
		return "", fmt.Errorf("TLS PSK: %w", err)
	}
	defer clear(k.PSK)
	c, err := nvmefmt.DeriveTLS(k, conn.HostNQN, conn.SubsystemNQN)
	if err != nil {
		return "", fmt.Errorf("TLS PSK: %w", err)
	}
	defer clear(c.PSKV0)
	defer clear(c.PSKV1)
	if _, err := a.Keys.Set(c.IdentityV0, c.PSKV0); err != nil {
		return "", err
	}
	return c.IdentityV0, nil
}

func (a *Agent) dropPSK(desc string) {
	if desc == "" {
		return
	}
	if err := a.Keys.Remove(desc); err != nil {
		a.log().Error("remove TLS PSK", "identity", desc, "err", err)
	}
}

// connection is what the kernel needs from a grant and its credentials.
func connection(g *pb.Grant, c *pb.Credentials) (nvmefmt.Connection, error) {
	if g == nil || c == nil {
		return nvmefmt.Connection{}, errors.New("the gateway answered without a grant or credentials")
	}
	conn := nvmefmt.Connection{HostNQN: g.HostNqn, SubsystemNQN: g.SubsystemNqn,
		DHCHAPKey: c.DhchapHostSecret, DHCHAPCtrlKey: c.DhchapCtrlSecret, TLS: c.TlsPsk != "", TLSKey: c.TlsPsk}
	for _, p := range g.Ports {
		conn.Ports = append(conn.Ports, nvmefmt.Endpoint{Transport: p.Trtype, Address: p.Traddr, ServiceID: p.Trsvcid})
	}
	if err := conn.Validate(); err != nil {
		return nvmefmt.Connection{}, err
	}
	return conn, nil
}

// secretsChanged reports whether b's secrets differ from a's.
func secretsChanged(a, b nvmefmt.Connection) bool {
	return a.DHCHAPKey != b.DHCHAPKey || a.DHCHAPCtrlKey != b.DHCHAPCtrlKey || a.TLSKey != b.TLSKey
}

// interval is the time to the next renewal: RenewEvery, at most a third
// of the shortest grant's lifetime, at least a second.
func (a *Agent) interval() time.Duration {
	d := a.RenewEvery
	if d <= 0 {
		d = time.Minute
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.subs {
		if s.grant != nil && s.lifetime > 0 {
			d = min(d, s.lifetime/3)
		}
	}
	return max(d, time.Second)
}

// tick renews every grant, re-keys what rotated, reconnects what was lost
// and retries what failed. It reports whether every grant has ended.
func (a *Agent) tick(ctx context.Context) bool {
	a.mu.Lock()
	subs := make([]*sub, 0, len(a.subs))
	for _, s := range a.subs {
		subs = append(subs, s)
	}
	a.mu.Unlock()
	ended := 0
	for _, s := range subs {
		if a.tickOne(ctx, s) {
			ended++
		}
	}
	return ended == len(subs)
}

func (a *Agent) tickOne(ctx context.Context, s *sub) (ended bool) {
	a.mu.Lock()
	g := s.grant
	a.mu.Unlock()
	if g == nil {
		if err := a.connect(ctx, s); err != nil {
			if grantEnded(err) {
				a.log().Info("no new grant for the subsystem", "subsystem", s.nqn, "err", err)
				return true
			}
			a.fail(s, err)
		}
		return false
	}
	resp, err := a.Gateway.Renew(ctx, &pb.RenewRequest{GrantId: g.GrantId, Ttl: ttl(a.TTL)})
	switch {
	case grantEnded(err):
		a.log().Info("grant ended on the gateway; disconnecting", "subsystem", s.nqn, "grant", g.GrantId, "err", status.Convert(err).Message())
		a.detach(s)
		return true
	case err != nil:
		a.fail(s, fmt.Errorf("renew %s: %w", g.GrantId, err))
		if a.now().After(g.ExpiresAt.AsTime()) {
			// Expired without a renewal: the target drops the host; so do we.
			a.detach(s)
			return true
		}
		return false
	}
	if err := a.renewed(s, resp); err != nil {
		a.fail(s, err)
		return false
	}
	a.ok(s)
	return false
}

func ttl(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// grantEnded: the gateway says the grant (or the job) is over for good.
// Anything else (unavailable, deadline) is retried.
func grantEnded(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied:
		return true
	}
	return false
}

// renewed takes a renewal's answer: new expiry; new credentials, if they
// changed, go to the keyring and to the live controller; a controller the
// kernel lost is connected again.
func (a *Agent) renewed(s *sub, resp *pb.RenewResponse) error {
	conn, err := connection(resp.Grant, resp.Credentials)
	if err != nil {
		return err
	}
	now := a.now()
	a.mu.Lock()
	changed := secretsChanged(s.conn, conn)
	ctrl := s.ctrl
	s.grant, s.lastRenew, s.lifetime = resp.Grant, now, resp.Grant.ExpiresAt.AsTime().Sub(now)
	a.mu.Unlock()
	if changed {
		desc, err := a.putPSK(conn)
		if err != nil {
			return fmt.Errorf("re-key: %w", err)
		}
		how, err := a.rekey(ctrl, conn)
		if err != nil {
			return err
		}
		a.mu.Lock()
		s.conn, s.pskDesc, s.lastRekey = conn, desc, now
		ctrl, s.rekeys = how.ctrl, s.rekeys+1
		s.ctrl = ctrl
		a.mu.Unlock()
		a.log().Info("re-keyed the live controller", "subsystem", s.nqn, "controller", ctrl, "how", how.how, "key_version", resp.Grant.KeyVersion)
	}
	if _, err := a.Kernel.Info(ctrl); errors.Is(err, nvmehost.ErrNoController) {
		// Gone (the kernel gave up reconnecting): connect again with the
		// grant's current credentials.
		c, err := a.kernelConnect(conn, false)
		if err != nil {
			return fmt.Errorf("reconnect: %w", err)
		}
		a.mu.Lock()
		s.ctrl = c
		a.mu.Unlock()
		a.log().Info("reconnected a lost controller", "subsystem", s.nqn, "controller", c)
	}
	return nil
}

type rekeyed struct{ ctrl, how string }

// rekey hands the live controller ctrl the new secrets of conn. With the
// host's secret alone, in place: the kernel re-authenticates the live
// controller. When the controller's secret changes too (bidirectional
// authentication), no order of the two stores works in place: the
// re-authentication between them fails, and nvmet drops the controller on
// a failed re-authentication (seen on Linux 6.1). Then, with native
// multipath, a second path connects with the new secrets and the old one
// is deleted: the block device stays, I/O moves to the new path. Without
// multipath, in place all the same, and the kernel's reconnect (with the
// new secrets) follows the failure.
func (a *Agent) rekey(ctrl string, conn nvmefmt.Connection) (rekeyed, error) {
	if conn.DHCHAPCtrlKey != "" && a.Kernel.Multipath() {
		next, err := a.kernelConnect(conn, true)
		if err != nil {
			return rekeyed{}, fmt.Errorf("re-key: a path with the new secrets: %w", err)
		}
		if err := a.awaitPath(ctrl, next); err != nil {
			// The old path stays and still serves; the next renewal
			// tries again.
			if derr := a.Kernel.Delete(next); derr != nil && !errors.Is(derr, nvmehost.ErrNoController) {
				a.log().Error("re-key: the new path stays", "controller", next, "err", derr)
			}
			return rekeyed{}, fmt.Errorf("re-key: %w", err)
		}
		if err := a.Kernel.Delete(ctrl); err != nil && !errors.Is(err, nvmehost.ErrNoController) {
			// The new path serves; the old one fails its next
			// re-authentication or reconnect on its own.
			a.log().Error("re-key: the old path stays", "controller", ctrl, "err", err)
		}
		return rekeyed{ctrl: next, how: "new path " + next + " replaced " + ctrl}, nil
	}
	if err := a.Kernel.SetDHCHAP(ctrl, conn.DHCHAPKey, conn.DHCHAPCtrlKey); err != nil && !errors.Is(err, nvmehost.ErrNoController) {
		return rekeyed{}, fmt.Errorf("re-key controller %s: %w", ctrl, err)
	}
	return rekeyed{ctrl: ctrl, how: "in place"}, nil
}

// awaitPath waits until the new path next serves every namespace the old
// path ctrl serves. The kernel scans a new controller's namespaces after
// the connect returns; deleting the old path before the scan has attached
// the new one leaves the namespace without a path, and the kernel removes
// its block device under the reads (seen on Linux 6.1).
func (a *Agent) awaitPath(ctrl, next string) error {
	wait := a.PathWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	old, err := a.Kernel.Namespaces(ctrl)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		got, err := a.Kernel.Namespaces(next)
		if err != nil {
			return err
		}
		missing := missingFrom(got, old)
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("new path %s does not serve namespace(s) %s after %v; %s kept", next, strings.Join(missing, ", "), wait, ctrl)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// missingFrom lists the IDs of want that have does not.
func missingFrom(have, want []string) []string {
	var out []string
	for _, w := range want {
		if !slices.Contains(have, w) {
			out = append(out, w)
		}
	}
	return out
}

// detach deletes s's controller and removes its PSK; the grant is left to
// the caller.
func (a *Agent) detach(s *sub) error {
	a.mu.Lock()
	ctrl, desc := s.ctrl, s.pskDesc
	s.ctrl, s.pskDesc, s.grant = "", "", nil
	s.conn = nvmefmt.Connection{}
	a.mu.Unlock()
	var err error
	if ctrl != "" {
		if err = a.Kernel.Delete(ctrl); errors.Is(err, nvmehost.ErrNoController) {
			err = nil
		}
	}
	a.dropPSK(desc)
	return err
}

// shutdown deletes every controller, removes the PSKs and releases the
// grants: the targets stop allowing this host. It reports what did not
// happen (a release the gateway did not confirm leaves the host on the
// target until the gateway's retry).
func (a *Agent) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a.mu.Lock()
	subs := make([]*sub, 0, len(a.subs))
	for _, s := range a.subs {
		subs = append(subs, s)
	}
	a.mu.Unlock()
	var errs []error
	for _, s := range subs {
		a.mu.Lock()
		g := s.grant
		a.mu.Unlock()
		if g == nil {
			continue
		}
		if err := a.detach(s); err != nil {
			errs = append(errs, fmt.Errorf("%s: disconnect: %w", s.nqn, err))
		}
		if _, err := a.Gateway.Release(ctx, &pb.ReleaseRequest{GrantId: g.GrantId}); err != nil && !grantEnded(err) {
			errs = append(errs, fmt.Errorf("%s: release %s: %w", s.nqn, g.GrantId, err))
			continue
		}
		a.log().Info("released", "subsystem", s.nqn, "grant", g.GrantId)
	}
	return errors.Join(errs...)
}
