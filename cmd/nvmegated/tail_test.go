package main

import (
	"testing"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// The leader trims etcd's log to its tail once both copies hold it, and a
// replica started afterwards on an empty disk fills the history from the
// leader's copy: its log is the same tree and its store the same state.
func TestLogTrimmedNewReplicaFillsHistory(t *testing.T) {
	f := newFleet(t, 1)
	f.tune = func(c *EtcdConfig) { c.LogTrimEvery, c.LogKeep, c.LogCopies = "1s", 1, 2 }
	a, _ := f.replica(t, "a")
	b, _ := f.replica(t, "b")
	sub := acmeJob(t, f.dir, a.GRPCAddr(), b.GRPCAddr(), "stor-1")
	resp, err := pb.NewAccessClient(devConn(t, b.GRPCAddr(), f.dir, "acme-node-1")).Connect(ctxT(t), &pb.ConnectRequest{JobId: "job-1", SubsystemNqn: sub})
	if err != nil {
		t.Fatal(err)
	}
	// The log holds the policy loads, the inventory, the job and the
	// grant (9 entries): all but the last go from etcd.
	waitUntil(t, "etcd's log trimmed to its tail", func() bool {
		return a.tail.start.Load() >= 5 && b.tail.start.Load() >= 5
	})
	start := a.tail.start.Load()

	c, _ := f.replica(t, "c")
	waitUntil(t, "the new replica's copy holding the log", func() bool { return c.audit.Size() >= a.audit.Size() })
	waitUntil(t, "the new replica reading where the tail starts", func() bool { return c.tail.start.Load() >= start })
	size := a.audit.Size()
	ra, err := a.audit.RootAt(ctxT(t), size)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := c.audit.RootAt(ctxT(t), size); err != nil || rc != ra {
		t.Fatalf("the new replica's copy is another tree at %d (%v)", size, err)
	}
	waitUntil(t, "the new replica's store at the leader's revision", func() bool { return c.db.Revision() == a.db.Revision() })
	g, err := c.db.Grant(ctxT(t), resp.Grant.GrantId)
	if err != nil || g.HostNQN != resp.Grant.HostNqn {
		t.Fatalf("the new replica lacks the grant made before the trim: %+v, %v", g, err)
	}
}
