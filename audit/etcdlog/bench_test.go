package etcdlog_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/benchload"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

// BenchmarkAppend: durable appends per second and their p99 latency, by
// concurrent appenders, for the log replicated on a 3-member etcd cluster
// (in this process, each member with its own fsync'd WAL) and, in the same
// run, for the single-machine bbolt log.
//
//	go test -run '^$' -bench . -benchtime 20000x ./audit/etcdlog/
func BenchmarkAppend(b *testing.B) {
	c := etcdtest.Start(b, 3)
	cl := c.Client(b)
	// The floor: one etcd transaction as a commit makes (a compare, two
	// puts) of a commit's bytes, one at a time, on the same cluster.
	for _, n := range []int{8, 128} {
		b.Run(fmt.Sprintf("floor/txn-of-%d-entries", n), func(b *testing.B) {
			e := entry(1)
			data, err := e.Encode()
			if err != nil {
				b.Fatal(err)
			}
			val := strings.Repeat(string(data), n)
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				key := fmt.Sprintf("/floor/%d/%d", n, i)
				t0 := time.Now()
				if _, err := cl.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, val), clientv3.OpPut(fmt.Sprintf("/floor/%d/head", n), key)).Commit(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/txn")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
	// The floor under load: 16 writers, each one transaction of one entry
	// at a time on a key of its own (nothing ordered, nothing shared): the
	// wait for etcd's round in progress and then its own round, which no
	// ordered log can beat.
	b.Run("floor/16-writers-txn-of-1-entry", func(b *testing.B) {
		e := entry(1)
		data, err := e.Encode()
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		benchload.Run(b, 16, "txns", func(i, w int) error {
			key := fmt.Sprintf("/floor16/%d", i)
			_, err := cl.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
				Then(clientv3.OpPut(key, string(data)), clientv3.OpPut(fmt.Sprintf("/floor16/head/%d", w), key)).Commit()
			return err
		})
	})
	// etcd3 is the replicated log as it runs (one commit in flight, the
	// group wait); etcd3-no-group-wait sends a commit as soon as the one
	// before is answered, and etcd3-two-in-flight pipelines two, for the
	// ratios in one run.
	for _, backend := range []string{"etcd3", "etcd3-no-group-wait", "etcd3-two-in-flight", "bbolt"} {
		for _, n := range []int{16, 256} {
			b.Run(fmt.Sprintf("%s/appenders=%d", backend, n), func(b *testing.B) {
				l, tr := benchLog(b, cl, backend)
				benchAppenders(b, l, n)
				tr.report(b)
			})
		}
	}
	// Open loop: appends from independent callers at a fixed rate (Poisson
	// arrivals), each timed from its issue — what the group wait costs when
	// an answered appender does not append again at once.
	for _, backend := range []string{"etcd3", "etcd3-no-group-wait"} {
		for _, rate := range []int{1000, 3000} {
			b.Run(fmt.Sprintf("open/%s/rate=%d", backend, rate), func(b *testing.B) {
				l, tr := benchLog(b, cl, backend)
				ctx := context.Background()
				benchload.RunOpen(b, float64(rate), "appends", func(i int) error {
					_, _, err := l.Append(ctx, entry(i))
					return err
				})
				tr.report(b)
			})
		}
	}
}

// benchRuns gives every run a log of its own in etcd.
var benchRuns atomic.Int64

// benchLog opens a log of the backend a benchmark row names, closed when
// the row ends: bbolt alone, or replicated on cl (etcd3 as it runs, or
// with one setting changed), with the replica's share timed.
func benchLog(b *testing.B, cl *clientv3.Client, backend string) (*audit.Log, *timedReplica) {
	opts := audit.Options{Origin: origin}
	var tr *timedReplica
	if backend != "bbolt" {
		tr = &timedReplica{Replica: etcdlog.New(cl, fmt.Sprintf("/bench/%s/%d/", backend, benchRuns.Add(1)))}
		opts.Replica = tr
	}
	switch backend {
	case "etcd3-two-in-flight":
		opts.ReplicaInFlight = 2
	case "etcd3-no-group-wait":
		opts.GroupWait = -1
	}
	l, err := audit.Open(filepath.Join(b.TempDir(), "audit.db"), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l, tr
}

func benchAppenders(b *testing.B, l *audit.Log, n int) {
	ctx := context.Background()
	benchload.Run(b, n, "appends", func(i, _ int) error {
		_, _, err := l.Append(ctx, entry(i))
		return err
	})
}
