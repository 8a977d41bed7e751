package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/nvmegate/nvmegate/audit"
)

// etcd keeps the audit log's tail only (audit/etcdlog, trim.go): every
// replica publishes how much of the log its copy holds on its disk, and
// the leader deletes from etcd what enough live copies hold and compacts
// etcd's history behind it. Without this etcd grows with every grant
// until its quota stops every write.

// tailState is what this replica knows of etcd's tail, for the metrics.
type tailState struct {
	start atomic.Uint64 // where the tail starts, as last read or trimmed
}

// reportCopy publishes this copy's size every t.every under a lease of
// its own, until ctx ends (then the lease is revoked: a stopped replica
// holds back no trim).
func (r *replication) reportCopy(ctx context.Context, l *audit.Log, t tail, st *tailState, log *slog.Logger) {
	ttl := int(max(3*t.every/time.Second, 10))
	for ctx.Err() == nil {
		s, err := concurrency.NewSession(r.client, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			log.Warn("cannot publish this replica's copy of the audit log (etcd); retrying", "err", err)
			sleepCtx(ctx, t.every)
			continue
		}
		report := func() {
			if err := r.log.Report(ctx, r.name, l.Size(), s.Lease()); err != nil && ctx.Err() == nil {
				log.Warn("cannot publish this replica's copy of the audit log (etcd); retrying", "err", err)
			}
			if start, err := r.log.Start(ctx); err == nil {
				st.start.Store(start)
			}
		}
		report()
		tick := time.NewTicker(t.every)
	session:
		for {
			select {
			case <-ctx.Done():
				break session
			case <-s.Done():
				break session // the lease was lost: a new one
			case <-tick.C:
				report()
			}
		}
		tick.Stop()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_, _ = r.client.Revoke(rctx, s.Lease())
		cancel()
	}
}

// trimLog is the leader's: every t.every, it deletes from etcd the commits
// that at least t.copies live copies hold and that lie more than t.keep
// entries behind the head, then compacts etcd's history up to the trim
// before (a watch that lags by a whole period starts again from a read).
// ctx carries the term's fence.
func (r *replication) trimLog(ctx context.Context, l *audit.Log, t tail, st *tailState, log *slog.Logger) {
	var before int64
	every(ctx, t.every, func() {
		pos, err := r.log.Positions(ctx)
		if err != nil {
			log.Warn("audit log not trimmed in etcd; retrying", "err", err)
			return
		}
		if len(pos) < t.copies {
			log.Debug("audit log not trimmed in etcd: fewer live copies than etcd.log_copies", "copies", len(pos), "log_copies", t.copies)
			return
		}
		size := l.Size()
		upTo := size - min(size, t.keep)
		for _, p := range pos {
			upTo = min(upTo, p)
		}
		start, rev, err := r.log.Trim(ctx, upTo)
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("audit log not trimmed in etcd; retrying", "err", err)
			}
			return
		}
		st.start.Store(start)
		if rev == 0 {
			return
		}
		if before > 0 {
			if err := r.log.Compact(ctx, before); err != nil {
				log.Warn("etcd's history not compacted; retrying at the next trim", "err", err)
				return
			}
		}
		before = rev
		log.Debug("audit log trimmed in etcd", "start", start, "head", size)
	})
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
