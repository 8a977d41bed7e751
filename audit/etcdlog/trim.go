package etcdlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
)

// etcd keeps the log's tail only: the leader trims the commits that enough
// replicas' copies hold durably (Positions), so that etcd stays small
// however long the log grows. The copies are the history's home
// (audit.HistorySource).

func (l *Log) startKey() string          { return l.prefix + "start" }
func (l *Log) posKey(name string) string { return l.prefix + "pos/" + name }
func (l *Log) posPrefix() string         { return l.prefix + "pos/" }
func decodeHead(v []byte) (uint64, [32]byte, error) {
	var root [32]byte
	if len(v) != 40 {
		return 0, root, fmt.Errorf("etcdlog: a tree head of %d bytes", len(v))
	}
	copy(root[:], v[8:])
	return binary.BigEndian.Uint64(v), root, nil
}

// tail is where the stored tail starts: the size and root of the tree its
// first commit extends (0 and the empty root before any trim).
func (l *Log) tail(ctx context.Context, opts ...clientv3.OpOption) (uint64, [32]byte, error) {
	resp, err := l.kv.Get(ctx, l.startKey(), opts...)
	if err != nil {
		return 0, [32]byte{}, fmt.Errorf("etcdlog: read where the tail starts: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, [32]byte{}, nil
	}
	return decodeHead(resp.Kvs[0].Value)
}

// Start is where the stored tail starts: the entries before it are only
// in the replicas' copies.
func (l *Log) Start(ctx context.Context) (uint64, error) {
	start, _, err := l.tail(ctx)
	return start, err
}

// Trim deletes the commits before the last commit that starts at or
// before upTo, and the checkpoints before it but the latest, under the
// condition of ctx (audit.WithCondition: the leader's fence). It returns
// where the tail starts then, and the etcd revision of the trim (0 if
// there was nothing to trim).
func (l *Log) Trim(ctx context.Context, upTo uint64) (uint64, int64, error) {
	cur, curRoot, err := l.tail(ctx)
	if err != nil {
		return 0, 0, err
	}
	if upTo <= cur {
		return cur, 0, nil
	}
	resp, err := l.kv.Get(ctx, l.commitKey(cur), clientv3.WithRange(l.commitKey(upTo+1)),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return cur, 0, fmt.Errorf("etcdlog: trim: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return cur, 0, nil
	}
	var at uint64
	if _, err := fmt.Sscanf(strings.TrimPrefix(string(resp.Kvs[0].Key), l.prefix+"c/"), "%016x", &at); err != nil {
		return cur, 0, fmt.Errorf("etcdlog: trim: commit key %q", resp.Kvs[0].Key)
	}
	c, err := decodeCommit(resp.Kvs[0].Value)
	if err != nil {
		return cur, 0, fmt.Errorf("etcdlog: trim: %s: %w", resp.Kvs[0].Key, err)
	}
	if at <= cur {
		return cur, 0, nil
	}
	// Checkpoints before the new start go too, but the latest: a copy
	// that catches up needs one.
	cpEnd := at
	if latest, err := l.kv.Get(ctx, l.cpLatestKey()); err != nil {
		return cur, 0, fmt.Errorf("etcdlog: trim: %w", err)
	} else if len(latest.Kvs) == 1 && len(latest.Kvs[0].Value) == 8 {
		cpEnd = min(cpEnd, binary.BigEndian.Uint64(latest.Kvs[0].Value))
	}
	// Of two trims from one start (a former leader's), one applies.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(l.startKey()), "=", head(cur, curRoot))}
	if cur == 0 {
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(l.startKey()), "=", 0)}
	}
	if f := audit.ConditionOf(ctx); f != nil {
		cmp, err := condition(f)
		if err != nil {
			return cur, 0, err
		}
		cmps = append(cmps, cmp)
	}
	txn, err := l.kv.Txn(ctx).If(cmps...).Then(
		clientv3.OpPut(l.startKey(), head(at, c.PrevRoot)),
		clientv3.OpDelete(l.commitKey(0), clientv3.WithRange(l.commitKey(at))),
		clientv3.OpDelete(l.cpKey(0), clientv3.WithRange(l.cpKey(cpEnd))),
	).Commit()
	if err != nil {
		return cur, 0, fmt.Errorf("etcdlog: trim to %d: %w", at, err)
	}
	if !txn.Succeeded {
		return cur, 0, fmt.Errorf("etcdlog: trim to %d: %w", at, audit.ErrFenced)
	}
	return at, txn.Header.Revision, nil
}

// Compact compacts etcd's history of revisions before rev (etcd keeps
// every old value until compacted, and a trim frees space only then). A
// revision compacted before is not an error.
func (l *Log) Compact(ctx context.Context, rev int64) error {
	if _, err := l.kv.Compact(ctx, rev); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("etcdlog: compact etcd's history before revision %d: %w", rev, err)
	}
	return nil
}

// Report publishes the size of the copy of replica name, durable on its
// disk, under lease: the trim keeps what a live replica's copy lacks.
func (l *Log) Report(ctx context.Context, name string, size uint64, lease clientv3.LeaseID) error {
	if _, err := l.kv.Put(ctx, l.posKey(name), string(binary.BigEndian.AppendUint64(nil, size)), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("etcdlog: report this copy's size: %w", err)
	}
	return nil
}

// Positions are the copies' sizes the live replicas reported, by name.
func (l *Log) Positions(ctx context.Context) (map[string]uint64, error) {
	resp, err := l.kv.Get(ctx, l.posPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdlog: read the copies' sizes: %w", err)
	}
	out := make(map[string]uint64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if len(kv.Value) != 8 {
			return nil, fmt.Errorf("etcdlog: %s: a size of %d bytes", kv.Key, len(kv.Value))
		}
		out[strings.TrimPrefix(string(kv.Key), l.posPrefix())] = binary.BigEndian.Uint64(kv.Value)
	}
	return out, nil
}
