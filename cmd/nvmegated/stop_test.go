package main

import (
	"context"
	"os"
	"runtime/pprof"
	"sync"
	"testing"
	"time"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Two replicas on a one-member etcd, connects in flight through the one
// that does not lead; etcd stops, then both replicas are stopped (as by
// SIGTERM to both, a rolling restart during an etcd outage). Both stop
// within 20 s: the graceful stop's 10 s (stopTimeout), then the etcd
// client closed under whatever still waits on it. Before, the leader
// stopped and the other never did: its elector's campaign resigned with
// no deadline, and writes begun by the connects waited for etcd as long
// as it was away (issue 29, defect 6).
func TestReplicasStopWhileEtcdIsDown(t *testing.T) {
	f := newFleet(t, 1)
	dir, c := f.dir, f.etcd
	a, stopA := f.replica(t, "a")
	b, stopB := f.replica(t, "b")
	sub := acmeJob(t, dir, a.GRPCAddr(), b.GRPCAddr(), "stor-1")
	waitUntil(t, "a leader", func() bool { return a.repl.elector.Leading() != b.repl.elector.Leading() })
	follower := b
	if b.repl.elector.Leading() {
		follower = a
	}

	// Connects through the follower, two at a time, without end.
	ctx, cancel := context.WithCancel(context.Background())
	var (
		load          sync.WaitGroup
		mu            sync.Mutex
		granted, errs int
	)
	for _, node := range []string{"acme-node-1", "acme-node-2"} {
		ac := pb.NewAccessClient(devConn(t, follower.GRPCAddr(), dir, node))
		load.Add(1)
		go func() {
			defer load.Done()
			for ctx.Err() == nil {
				_, err := ac.Connect(ctx, &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
				mu.Lock()
				if err == nil {
					granted++
				} else {
					errs++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	defer func() { cancel(); load.Wait() }()
	waitUntil(t, "connects granted through the follower", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return granted >= 4
	})

	// etcd goes; the connects in flight wait on it.
	c.Close()
	time.Sleep(2 * time.Second)

	// Both stopped at once; each must return (Run, then Close) in 20 s.
	const bound = 20 * time.Second
	stopped := time.Now()
	took := make([]time.Duration, 2)
	var wg sync.WaitGroup
	for i, stop := range []func(){stopA, stopB} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop()
			took[i] = time.Since(stopped)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound + 10*time.Second):
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatalf("the replicas not stopped %s after SIGTERM with etcd down", bound+10*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("with etcd down and connects in flight through the follower (%s): a stopped in %s, b in %s (%d connects granted before, %d refused)",
		follower.Config.Etcd.Name, took[0].Round(time.Millisecond), took[1].Round(time.Millisecond), granted, errs)
	for i, d := range took {
		if d > bound {
			t.Errorf("replica %s stopped %s after SIGTERM with etcd down; the bound is %s", []string{"a", "b"}[i], d.Round(time.Millisecond), bound)
		}
	}
}
