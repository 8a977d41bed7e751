package etcdlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit/etcdlog"
	"github.com/nvmegate/nvmegate/internal/etcdtest"
)

// A follower's copy takes the leader's commits, with their payloads, from
// the watch alone: no Sync reads them.
func TestFollowCommitsFromTheWatch(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cl := c.Client(t)
	leader, follower := replica(t, cl, t.TempDir()), replica(t, cl, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	syncs := 0
	go func() {
		defer close(done)
		_ = etcdlog.New(cl, "/nvmegate/audit/").FollowCommits(ctx, cl, follower.Offer, func(context.Context, uint64) error {
			syncs++
			return nil
		})
	}()
	defer func() { cancel(); <-done }()
	fctx, _ := fence(t, cl, "/term")
	for i := range 5 {
		if _, err := leader.Propose(fctx, &change{rev: uint64(i + 1), payload: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := follower.WaitSize(wctx, leader.Size()); err != nil {
		t.Fatalf("the follower's copy is at %d of %d: %v", follower.Size(), leader.Size(), err)
	}
	if last, err := follower.LastChange(); err != nil || last != 5 {
		t.Fatalf("the follower's last change %d (%v), want 5", last, err)
	}
}
