package main

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A replica's etcd client rides out a member that hangs (a stopped
// process, a wedged disk): its calls do not wait on that member, and its
// watches and the leader's lease move to the others (issue 29, defect 6).
// Before, with one member of three frozen, no connect succeeded: every
// read barrier made several reads, round-robin over the members, and one
// of them was all but sure to wait on the frozen member until the
// barrier's 10 s ran out. A member that is down (connection refused) was
// never the problem: the client skips it on its own.
//
// Three layers, from the fastest:
//   - probes: each member answers a read of its own every
//     etcdProbeInterval (served by the member, with a leader: a
//     serializable Get that requires one). One that has not answered within
//     etcdProbeTimeout leaves the client's endpoints and its connections
//     are closed, so that what waits on it — calls, watches, the lease's
//     keepalive stream — fails over at once; it comes back once it
//     answers. A member is never left alone out: when none answers, the
//     client keeps them all.
//   - a read (a Range) has etcdReadAttempt per attempt; one with no answer
//     by then is retried by the etcd client's own retry (its "call
//     deadline" case), on the balancer's next member, within the caller's
//     deadline (the read barrier's 10 s holds several attempts). Writes are
//     not retried that way: one may have been applied.
//   - gRPC keepalive pings on the client's connections: a connection that
//     answers no ping within etcdKeepAliveTimeout is closed. gRPC pings no
//     more often than every 10 s, which is why the probes exist; the pings
//     still cover what the probes cannot close (a single endpoint, a unix
//     socket's).
//
// And every call ends at the replica's stop's deadline (etcdCalls.abort):
// the client waits for a member to be ready as long as a call's context
// lasts, and some calls have a context of their own.
const (
	etcdKeepAliveTime    = 10 * time.Second // gRPC's floor
	etcdKeepAliveTimeout = 3 * time.Second
	etcdReadAttempt      = 2 * time.Second
	etcdProbeInterval    = 500 * time.Millisecond
	etcdProbeTimeout     = 1500 * time.Millisecond
)

// rangeMethod is the etcd read whose attempts etcdReadAttempt bounds.
const rangeMethod = "/etcdserverpb.KV/Range"

// errEtcdStopped is what a call to etcd returns once the replica's stop
// has reached its deadline (replication.abort). Its code is one the etcd
// client does not retry: a closed client's own error (Canceled, "the
// client connection is closing") it retries, 100 times 25 ms apart, and
// a call that has its own context — a write that once begun runs to its
// end — went on failing that way for seconds, one call after another.
var errEtcdStopped = status.Error(codes.Aborted, "etcd: the replica is stopping: the call was abandoned at the stop's deadline")

// etcdCalls is the client's interceptor of each attempt of a unary call.
// gRPC runs it inside the etcd client's retry interceptor (the client's
// WithUnaryInterceptor runs first, then the chained ones), which retries
// an attempt whose own deadline ran out while the caller's context lasts.
type etcdCalls struct {
	stopped context.Context // done at the stop's deadline
	abort   context.CancelFunc
}

func newEtcdCalls() *etcdCalls {
	ctx, cancel := context.WithCancel(context.Background())
	return &etcdCalls{stopped: ctx, abort: cancel}
}

// unary gives a read's attempt etcdReadAttempt, and ends every attempt at
// the stop's deadline.
func (e *etcdCalls) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if e.stopped.Err() != nil {
		return errEtcdStopped
	}
	var cancel context.CancelFunc
	if method == rangeMethod {
		ctx, cancel = context.WithTimeout(ctx, etcdReadAttempt)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	defer context.AfterFunc(e.stopped, cancel)()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil && e.stopped.Err() != nil {
		return errEtcdStopped
	}
	return err
}

// etcdConns dials the client's connections and keeps them by address, so
// that those to a member found hung can be closed: gRPC otherwise drains
// a removed endpoint's connection gracefully, waiting for its streams and
// calls, which a hung member never ends.
type etcdConns struct {
	mu    sync.Mutex
	conns map[string]map[*etcdConn]struct{}
}

type etcdConn struct {
	net.Conn
	addr   string
	owner  *etcdConns
	closed sync.Once
}

func (c *etcdConn) Close() error {
	c.closed.Do(func() {
		o := c.owner
		o.mu.Lock()
		delete(o.conns[c.addr], c)
		o.mu.Unlock()
	})
	return c.Conn.Close()
}

// dial is gRPC's dialer for the client: addr as the etcd client's
// resolver gives it (host:port, or unix:path and unix://path).
func (t *etcdConns) dial(ctx context.Context, addr string) (net.Conn, error) {
	network, address := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix://"); ok {
		network, address = "unix", p
	} else if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, address = "unix", p
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	c := &etcdConn{Conn: nc, addr: addr, owner: t}
	t.mu.Lock()
	if t.conns == nil {
		t.conns = map[string]map[*etcdConn]struct{}{}
	}
	if t.conns[addr] == nil {
		t.conns[addr] = map[*etcdConn]struct{}{}
	}
	t.conns[addr][c] = struct{}{}
	t.mu.Unlock()
	return c, nil
}

// closeAddr closes every connection to addr; it returns how many.
func (t *etcdConns) closeAddr(addr string) int {
	t.mu.Lock()
	var cs []*etcdConn
	for c := range t.conns[addr] {
		cs = append(cs, c)
	}
	t.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	return len(cs)
}

// endpointAddr is the address the etcd client dials for endpoint ep: the
// host:port of an http(s) URL, ep itself otherwise.
func endpointAddr(ep string) string {
	if u, err := url.Parse(ep); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		return u.Host
	}
	return ep
}

// members keeps a client's endpoints to the etcd members that answer
// their probes (the first layer above).
type members struct {
	client *clientv3.Client
	conns  *etcdConns
	all    []string
	probes []*clientv3.Client // one per member, in the order of all
	key    string             // what a probe reads
	log    *slog.Logger

	mu      sync.Mutex
	down    map[string]bool
	current []string // the client's endpoints
	stop    context.CancelFunc
	done    sync.WaitGroup
}

// watchMembers starts probing cfg's members, one client each, on behalf
// of cl (whose connections conns dialed); stop it with close.
func watchMembers(cl *clientv3.Client, conns *etcdConns, cfg clientv3.Config, key string, log *slog.Logger) (*members, error) {
	m := &members{client: cl, conns: conns, all: slices.Clone(cfg.Endpoints), current: slices.Clone(cfg.Endpoints),
		key: key, log: log, down: map[string]bool{}}
	for _, ep := range m.all {
		pc := cfg
		pc.Endpoints = []string{ep}
		pc.DialOptions = nil
		pc.Logger = zap.NewNop()
		p, err := clientv3.New(pc)
		if err != nil {
			m.close()
			return nil, err
		}
		m.probes = append(m.probes, p)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.stop = cancel
	for i, ep := range m.all {
		m.done.Add(1)
		go func() {
			defer m.done.Done()
			m.probe(ctx, ep, m.probes[i])
		}()
	}
	return m, nil
}

// probe asks member ep for its read every etcdProbeInterval until ctx
// ends, and marks it up or down.
func (m *members) probe(ctx context.Context, ep string, p *clientv3.Client) {
	for {
		pctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), etcdProbeTimeout)
		_, err := p.Get(pctx, m.key, clientv3.WithSerializable(), clientv3.WithCountOnly())
		cancel()
		if ctx.Err() != nil {
			return
		}
		m.mark(ep, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(etcdProbeInterval):
		}
	}
}

// mark records the outcome of ep's probe: the client's endpoints become
// the members that answer (all of them if none does), and the
// connections to one taken out are closed.
func (m *members) mark(ep string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.down[ep] == (err != nil) {
		return
	}
	if err != nil {
		m.down[ep] = true
		m.log.Warn("etcd member does not answer", "endpoint", ep, "within", etcdProbeTimeout, "err", err)
	} else {
		delete(m.down, ep)
		m.log.Info("etcd member answers again", "endpoint", ep)
	}
	var up []string
	for _, e := range m.all {
		if !m.down[e] {
			up = append(up, e)
		}
	}
	if len(up) == 0 {
		up = m.all // none answers: nothing better to do than wait on them all
	}
	if slices.Equal(up, m.current) {
		return
	}
	gone := slices.DeleteFunc(slices.Clone(m.current), func(e string) bool { return slices.Contains(up, e) })
	m.client.SetEndpoints(up...)
	m.current = up
	for _, e := range gone {
		n := m.conns.closeAddr(endpointAddr(e))
		m.log.Warn("etcd member left out; its calls and streams go to the others", "endpoint", e, "connections_closed", n, "endpoints", up)
	}
	if err == nil {
		m.log.Info("etcd endpoints", "endpoints", up)
	}
}

// close stops the probes and closes their clients.
func (m *members) close() {
	if m.stop != nil {
		m.stop()
	}
	m.done.Wait()
	for _, p := range m.probes {
		p.Close()
	}
}
