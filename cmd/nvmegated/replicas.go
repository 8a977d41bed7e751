package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/leader"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/targetagent"
)

// replication is what a gateway replica shares with the others on etcd:
// the store, the audit log and the leadership of the background work.
type replication struct {
	client  *clientv3.Client
	members *members // keeps the client off a member that hangs (etcdclient.go)
	log     *etcdlog.Log
	elector *leader.Elector
	prefix  string
	name    string // this replica's, in the election

	calls     *etcdCalls
	closeOnce sync.Once
	closeErr  error
}

// openReplication connects to etcd (mTLS from files when configured),
// with a client that rides out a member that hangs (etcdclient.go).
func openReplication(c EtcdConfig, log *slog.Logger) (*replication, error) {
	prefix := c.Prefix
	if prefix == "" {
		prefix = "/nvmegate/"
	}
	name := c.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("etcd: no replica name and no host name: %w", err)
		}
		name = h
	}
	dial := 10 * time.Second
	if c.DialTimeout != "" {
		dial, _ = time.ParseDuration(c.DialTimeout) // checked by validate
	}
	conns := &etcdConns{}
	cfg := clientv3.Config{Endpoints: c.Endpoints, DialTimeout: dial, Logger: zap.NewNop(),
		DialKeepAliveTime: etcdKeepAliveTime, DialKeepAliveTimeout: etcdKeepAliveTimeout}
	if c.CACert != "" {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(c.CACert)
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd: no certificate in %s", c.CACert)
		}
		cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
		if err != nil {
			return nil, fmt.Errorf("etcd: client certificate: %w", err)
		}
		cfg.TLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	probeCfg := cfg
	calls := newEtcdCalls()
	cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(conns.dial), grpc.WithChainUnaryInterceptor(calls.unary)}
	cl, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	r := &replication{client: cl, prefix: prefix, calls: calls, name: name,
		log:     etcdlog.New(cl, prefix+"audit/"),
		elector: &leader.Elector{Client: cl, Prefix: prefix + "leader/", ID: name, TTL: c.LeaseTTL}}
	if len(c.Endpoints) > 1 {
		if r.members, err = watchMembers(cl, conns, probeCfg, prefix+"store/rev", log); err != nil {
			cl.Close()
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	// Fail the start, not the first write, when etcd cannot be reached.
	ctx, cancel := context.WithTimeout(context.Background(), dial)
	defer cancel()
	if _, err := cl.Get(ctx, prefix+"store/rev"); err != nil {
		r.close()
		return nil, fmt.Errorf("etcd %v: %w", c.Endpoints, err)
	}
	return r, nil
}

// abort ends every call to etcd, in flight or to come, with
// errEtcdStopped, and closes the client (its watches, the lease's
// keepalives): the stop's deadline (Main.etcdStopDeadline).
func (r *replication) abort() {
	r.calls.abort()
	_ = r.close()
}

// close closes the etcd client and its probes. Idempotent: the stop's
// deadline may have closed it before Main.Close.
func (r *replication) close() error {
	r.closeOnce.Do(func() {
		if r.members != nil {
			r.members.close()
		}
		r.closeErr = r.client.Close()
	})
	return r.closeErr
}

// followLog applies the leader's commits to this copy as the watch
// delivers them, and the checkpoints.
func (r *replication) followLog(ctx context.Context, l *audit.Log) error {
	_ = r.log.FollowCommits(ctx, r.client, l.Offer, func(ctx context.Context, size uint64) error {
		if size > 0 && l.Size() >= size {
			return nil // this copy has it: its own commit, or a lost race's catch-up
		}
		return l.Sync(ctx)
	})
	return nil
}

// ignoreCanceled is err, unless it is only the end of the daemon's context.
func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// readBarrier is the gateway's read barrier: none for a single gateway,
// the store's Sync for a replica.
func (m *Main) readBarrier() func(context.Context) error {
	if m.repl == nil {
		return nil
	}
	return m.db.Sync
}

// targetPeers relays the programming of targets between replicas through
// etcd: <prefix>targets/<id>/applied holds the store revision (uint64 BE)
// as of which the target's agent, on whichever replica it streams from,
// last acknowledged its state. A replica answering a call that changes a
// target whose agent streams elsewhere waits for that key to reach its own
// revision (targetagent.Peers); the replica the agent streams from
// programs it as it applies each change, and moves the key.
type targetPeers struct {
	client *clientv3.Client
	prefix string
	db     *store.DB
	wait   time.Duration // at most, for another replica's agent

	mu sync.Mutex
	// targets and subs are what other replicas' changes touched, each
	// with the revisions of those changes not yet relayed.
	targets map[string][]uint64
	subs    map[string][]uint64
	notify  chan struct{}
}

func newTargetPeers(r *replication, db *store.DB, wait time.Duration) *targetPeers {
	return &targetPeers{client: r.client, prefix: r.prefix + "targets/", db: db, wait: wait,
		targets: map[string][]uint64{}, subs: map[string][]uint64{}, notify: make(chan struct{}, 1)}
}

func (p *targetPeers) key(target string) string { return p.prefix + target + "/applied" }

// Await waits until target's agent acknowledged this replica's revision.
func (p *targetPeers) Await(ctx context.Context, target string) error {
	rev := p.db.Revision()
	ctx, cancel := context.WithTimeout(ctx, p.wait)
	defer cancel()
	got, err := p.client.Get(ctx, p.key(target))
	if err != nil {
		return fmt.Errorf("target %s: %w", target, err)
	}
	if len(got.Kvs) == 1 && appliedRev(got.Kvs[0].Value) >= rev {
		return nil
	}
	wch := p.client.Watch(clientv3.WithRequireLeader(ctx), p.key(target), clientv3.WithRev(got.Header.Revision+1))
	for resp := range wch {
		for _, ev := range resp.Events {
			if appliedRev(ev.Kv.Value) >= rev {
				return nil
			}
		}
	}
	return fmt.Errorf("target %s: no gateway replica's agent acknowledged the state as of revision %d within %s (is the target's agent connected?)", target, rev, p.wait)
}

func appliedRev(v []byte) uint64 {
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// changed is the store's Applied hook: it notes what another replica's
// change touched, and at which revision, for relay (it must not block).
// The store calls it before its revision moves to rev.
func (p *targetPeers) changed(rev uint64, targets, subsystems []string) {
	p.mu.Lock()
	for _, t := range targets {
		p.targets[t] = append(p.targets[t], rev)
	}
	for _, s := range subsystems {
		p.subs[s] = append(p.subs[s], rev)
	}
	p.mu.Unlock()
	p.wake()
}

func (p *targetPeers) wake() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// take returns the targets and subsystems touched by changes up to rev,
// and whether changes past it wait (noted, but not yet applied to the
// copy when rev was read: they stay for a later round).
func (p *targetPeers) take(rev uint64) (targets, subs map[string]bool, later bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	split := func(pending map[string][]uint64) map[string]bool {
		out := map[string]bool{}
		for k, revs := range pending {
			rest := slices.DeleteFunc(revs, func(r uint64) bool { return r <= rev })
			if len(rest) < len(revs) || len(revs) == 0 {
				out[k] = true
			}
			if len(rest) == 0 {
				delete(pending, k)
			} else {
				pending[k], later = rest, true
			}
		}
		return out
	}
	return split(p.targets), split(p.subs), later
}

// retry notes target as touched again at rev: its programming failed,
// and it must not be marked acknowledged before a round programs it.
func (p *targetPeers) retry(target string, rev uint64) {
	p.mu.Lock()
	p.targets[target] = append(p.targets[target], rev)
	p.mu.Unlock()
}

// relay programs the targets whose agents stream from this replica as the
// other replicas' changes arrive, and records each target's acknowledged
// revision: the touched ones once programmed, the others at once (their
// state did not change).
func (p *targetPeers) relay(ctx context.Context, agent *targetagent.Agent, hub *targetagent.Hub, warn func(string, ...any)) error {
	// The stream each target had at the last round: a stream new since
	// has acknowledged nothing yet, and is programmed before its revision
	// is recorded (its first state may still be on the way).
	seen := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.notify:
		}
		// The revision first, then what the hook noted up to it: the hook
		// hears of a change before the revision moves, so every change up
		// to rev is in what is taken (or was in an earlier round), and an
		// agent is never marked acknowledged at a revision whose change
		// it was not sent (issue 29, defect 11).
		rev := p.db.Revision()
		touched, subs, later := p.take(rev)
		if later {
			// A change being applied now: its round comes once the
			// revision has moved (the hook will not wake us again).
			time.AfterFunc(time.Millisecond, p.wake)
		}
		for nqn := range subs {
			if s, err := p.db.Subsystem(ctx, nqn); err == nil {
				touched[s.TargetID] = true
			}
		}
		streams := hub.Streams()
		for id, stream := range streams {
			if touched[id] || seen[id] != stream {
				agent.InventoryChanged(id)
				if err := agent.Program(ctx, id); err != nil {
					warn("target not programmed after another replica's change", "target", id, "err", err)
					p.retry(id, rev)
					time.AfterFunc(time.Second, p.wake)
					continue
				}
			}
			seen[id] = stream
			if err := p.record(ctx, id, rev); err != nil {
				warn("target's acknowledgement not recorded in etcd", "target", id, "err", err)
			}
		}
		for id := range seen {
			if _, ok := streams[id]; !ok {
				delete(seen, id)
			}
		}
	}
}

// record moves target's acknowledged revision up to rev (never down).
func (p *targetPeers) record(ctx context.Context, target string, rev uint64) error {
	k, v := p.key(target), string(binary.BigEndian.AppendUint64(nil, rev))
	for _, cmp := range []clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "<", v), clientv3.Compare(clientv3.CreateRevision(k), "=", 0)} {
		resp, err := p.client.Txn(ctx).If(cmp).Then(clientv3.OpPut(k, v)).Commit()
		if err != nil || resp.Succeeded {
			return err
		}
	}
	return nil
}
