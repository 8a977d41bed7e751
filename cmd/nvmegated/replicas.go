package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/leader"
	"github.com/nvmegate/nvmegate/store"
	"github.com/nvmegate/nvmegate/store/etcdstore"
)

// compactInterval is how often the leader snapshots the replicated store
// and trims the changes the snapshot covers.
const compactInterval = 5 * time.Minute

// replication is what a gateway replica shares with the others on etcd:
// the store, the audit log and the leadership of the background work.
type replication struct {
	client  *clientv3.Client
	store   *etcdstore.Store
	log     *etcdlog.Log
	elector *leader.Elector
	prefix  string
}

// openReplication connects to etcd (mTLS from files when configured).
func openReplication(c EtcdConfig) (*replication, error) {
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
	cfg := clientv3.Config{Endpoints: c.Endpoints, DialTimeout: dial, Logger: zap.NewNop()}
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
	cl, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	// Fail the start, not the first write, when etcd cannot be reached.
	ctx, cancel := context.WithTimeout(context.Background(), dial)
	defer cancel()
	if _, err := cl.Get(ctx, prefix+"store/rev"); err != nil {
		cl.Close()
		return nil, fmt.Errorf("etcd %v: %w", c.Endpoints, err)
	}
	return &replication{client: cl, prefix: prefix,
		store:   etcdstore.New(cl, prefix+"store/"),
		log:     etcdlog.New(cl, prefix+"audit/"),
		elector: &leader.Elector{Client: cl, Prefix: prefix + "leader/", ID: name, TTL: c.LeaseTTL}}, nil
}

// followStore applies the other replicas' changes to this copy as they
// commit: a watch on the store's revision wakes a Sync.
func (r *replication) followStore(ctx context.Context, db *store.DB) error {
	for ctx.Err() == nil {
		_ = db.Sync(ctx) // an error is retried at the next change
		for resp := range r.client.Watch(clientv3.WithRequireLeader(ctx), r.prefix+"store/rev") {
			if resp.Err() != nil {
				break
			}
			_ = db.Sync(ctx)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// followLog applies the other replicas' audit commits to this copy.
func (r *replication) followLog(ctx context.Context, l *audit.Log) error {
	_ = r.log.Follow(ctx, r.client, l.Sync)
	return nil
}

// compact snapshots the store every compactInterval while ctx (a leader's
// fenced term) lasts.
func (r *replication) compact(ctx context.Context, db *store.DB, warn func(string, ...any)) {
	every(ctx, compactInterval, func() {
		if _, err := r.store.Compact(ctx, db); err != nil {
			warn("replicated store not compacted", "err", err)
		}
	})
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
