package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// DefaultTTL is the session lease's TTL in seconds: how long a dead or
// paused leader holds the leadership before another replica takes it.
const DefaultTTL = 10

// Elector campaigns for a replica.
type Elector struct {
	Client *clientv3.Client
	Prefix string // the election's key prefix, e.g. "/nvmegate/leader/"
	ID     string // this replica's name, the value of its election key
	// Value, if set, is the election key's value instead of ID: what
	// the other replicas read of the leader (Current), such as the
	// address its writes are forwarded to.
	Value string
	TTL   int // seconds; zero means DefaultTTL
	Log   *slog.Logger

	leading atomic.Bool
}

// Term is one term of leadership: Ctx ends when it does, and Fence holds
// in etcd exactly while it lasts.
type Term struct {
	Ctx   context.Context
	Fence clientv3.Cmp
	Rev   int64 // the election key's creation revision: the term's number
	Lease clientv3.LeaseID
}

// Leading says whether this replica leads now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Run campaigns until ctx ends. Each time this replica wins, lead runs
// with the term; when lead returns, or the term ends first (lead must
// then return promptly: its Ctx is done), the replica resigns and
// campaigns again.
func (e *Elector) Run(ctx context.Context, lead func(Term)) error {
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ttl := e.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	for ctx.Err() == nil {
		err := e.term(ctx, ttl, lead)
		if ctx.Err() != nil {
			break
		}
		log.Warn("leader: campaign ended; campaigning again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return ctx.Err()
}

func (e *Elector) term(ctx context.Context, ttl int, lead func(Term)) error {
	s, err := concurrency.NewSession(e.Client, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
	if err != nil {
		return err
	}
	defer s.Close() // revokes the lease: a successor need not wait out the TTL
	el := concurrency.NewElection(s, e.Prefix)
	value := e.Value
	if value == "" {
		value = e.ID
	}
	if err := campaign(ctx, el, value); err != nil {
		return err
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.Done(): // the lease expired or was revoked
			cancel()
		case <-tctx.Done():
		}
	}()
	e.leading.Store(true)
	defer e.leading.Store(false)
	if e.Log != nil {
		e.Log.Info("leader: this replica leads", "id", e.ID, "term", el.Rev())
	}
	lead(Term{Ctx: tctx, Fence: clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev()), Rev: el.Rev(), Lease: s.Lease()})
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
	defer rcancel()
	if err := el.Resign(rctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if tctx.Err() != nil && ctx.Err() == nil {
		return errors.New("the session ended: leadership lost")
	}
	return nil
}

// Current is the value the leader of the election under prefix campaigned
// with (Elector.Value), and its term (the key's creation revision); ok is
// false while no replica leads. It is one read of etcd: the candidate
// whose key was created first leads.
func Current(ctx context.Context, kv clientv3.KV, prefix string) (value string, term int64, ok bool, err error) {
	resp, err := kv.Get(ctx, prefix+"/", clientv3.WithFirstCreate()...) // concurrency.Election's keys
	if err != nil {
		return "", 0, false, err
	}
	if len(resp.Kvs) == 0 {
		return "", 0, false, nil
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision, true, nil
}

// resignTimeout bounds a resignation: a replica that stops while etcd
// cannot be reached stops all the same, and its lease ends with its TTL.
const resignTimeout = 5 * time.Second

// campaign is el.Campaign, bounded by ctx. Campaign itself, when ctx ends
// while it waits, resigns under the client's context, which has no
// deadline: while etcd cannot be reached that lasts until the client is
// closed, and a replica that was not the leader never stopped (issue 29,
// defect 6). Here it is waited for no longer than a resignation; left to
// finish on its own, it ends when etcd answers or the client is closed,
// and the session's lease, revoked or run out, removes the candidate key
// either way.
func campaign(ctx context.Context, el *concurrency.Election, id string) error {
	done := make(chan error, 1)
	go func() { done <- el.Campaign(ctx, id) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(resignTimeout):
		return ctx.Err()
	}
}
