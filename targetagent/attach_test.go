package targetagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/targetagent"
)

// blockPeers is another replica whose agent never acknowledges.
type blockPeers struct{ called chan struct{} }

func (p *blockPeers) Await(ctx context.Context, target string) error {
	select {
	case p.called <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// An agent that attaches to a replica whose programming run was waiting
// for the agent's previous replica gets a state read from the store
// again, not the one the run built before it waited: that one may be
// older than what the agent applied elsewhere, and would go out labelled
// with the current revision (found by a review of issue 29's fixes).
func TestAttachedAgentGetsAFreshState(t *testing.T) {
	ctx := context.Background()
	db, _, km, tgt := oneTarget(t, keys.Options{Grace: time.Hour})
	if _, err := km.Rotate(ctx, sub, "test"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	g := &nvmegate.Grant{ID: "grant-aaaa", JobID: "j", Tenant: "acme", Node: "spiffe://x/node/a", HostNQN: hostA, SubsystemNQN: sub,
		KeyVersion: 1, IssuedAt: now, ExpiresAt: now.Add(time.Hour), State: nvmegate.GrantActive, DHCHAPHash: "sha384", DHGroup: "ffdhe3072"}
	if err := db.PutGrant(ctx, g); err != nil {
		t.Fatal(err)
	}
	peers := &blockPeers{called: make(chan struct{}, 1)}
	a := &targetagent.Agent{Store: db, Keys: km, Hub: &targetagent.Hub{}, Peers: peers}
	go a.Program(ctx, "t1")
	<-peers.called // the run built its state (host A in it) and waits for another replica's agent
	g2 := *g
	g2.State = nvmegate.GrantReleased
	if err := db.PutGrant(ctx, &g2); err != nil {
		t.Fatal(err)
	}
	relRev := db.Revision()
	s, err := a.Subscribe(tgt, true) // the agent attaches here
	if err != nil {
		t.Fatal(err)
	}
	u := <-s.Updates()
	hosts := 0
	for _, ss := range u.State.Subsystems {
		hosts += len(ss.Hosts)
	}
	if u.Revision < relRev || hosts > 0 {
		t.Errorf("a state labelled revision %d (>= the release at %d) still holds the released host", u.Revision, relRev)
	}
}
