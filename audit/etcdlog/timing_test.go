package etcdlog_test

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/nvmegate/nvmegate/audit"
)

// timedReplica measures the replica's share of an append: the commits,
// their entries and the time spent in etcd.
type timedReplica struct {
	audit.Replica
	commits, entries, nanos, conflicts atomic.Int64
}

func (r *timedReplica) Append(ctx context.Context, c audit.Commit) error {
	t0 := time.Now()
	err := r.Replica.Append(ctx, c)
	r.nanos.Add(int64(time.Since(t0)))
	r.commits.Add(1)
	r.entries.Add(int64(c.End - c.Start))
	if err != nil {
		r.conflicts.Add(1)
	}
	return err
}
