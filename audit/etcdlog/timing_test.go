package etcdlog_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit"
)

// timedReplica measures the replica's share of an append: the commits,
// their entries and the time spent in etcd.
type timedReplica struct {
	audit.Replica
	commits, entries, nanos, conflicts atomic.Int64
	mu                                 sync.Mutex
	lat                                []time.Duration
}

// p99 is the 99th percentile of the replica's time per commit.
func (r *timedReplica) p99() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[len(s)*99/100]
}

func (r *timedReplica) Append(ctx context.Context, c audit.Commit) error {
	t0 := time.Now()
	err := r.Replica.Append(ctx, c)
	d := time.Since(t0)
	r.nanos.Add(int64(d))
	r.mu.Lock()
	r.lat = append(r.lat, d)
	r.mu.Unlock()
	r.commits.Add(1)
	r.entries.Add(int64(c.End - c.Start))
	if err != nil {
		r.conflicts.Add(1)
	}
	return err
}

// report adds the replica's share to b's metrics; a nil r (the bbolt
// log) has none.
func (r *timedReplica) report(b *testing.B) {
	if r == nil || r.commits.Load() == 0 {
		return
	}
	b.ReportMetric(float64(r.entries.Load())/float64(r.commits.Load()), "entries/commit")
	b.ReportMetric(float64(r.nanos.Load())/float64(r.commits.Load())/1e6, "etcd-ms/commit")
	b.ReportMetric(float64(r.conflicts.Load()), "refused-commits")
	b.ReportMetric(float64(r.p99().Microseconds())/1000, "etcd-p99-ms")
}
