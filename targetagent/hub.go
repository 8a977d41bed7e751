package targetagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
)

// ErrAckTimeout is returned by Program when the target's agent did not
// acknowledge the state in time.
var ErrAckTimeout = errors.New("targetagent: the target's agent did not acknowledge in time")

// errStreamEnded: the agent's stream ended (it disconnected or reconnected)
// before it acknowledged; the agent sends the whole state to whatever
// programs the target now.
var errStreamEnded = errors.New("targetagent: the target agent's stream ended")

// Update is one message of the stream to a target's agent: the whole
// state, or a delta on top of the last generation sent.
type Update struct {
	State *fabric.State
	Delta *fabric.Delta
}

// Generation is the generation the update brings the target to.
func (u Update) Generation() uint64 {
	if u.Delta != nil {
		return u.Delta.Generation
	}
	return u.State.Generation
}

// Hub connects remote target agents (cmd/nvmegate-target): while a
// target's agent is connected, Program sends it the target's state — whole
// first, then deltas if it accepts them — and waits for its
// acknowledgement instead of applying it locally.
type Hub struct {
	// AckTimeout bounds the wait for an acknowledgement; default 10s.
	AckTimeout time.Duration

	mu   sync.Mutex
	subs map[string]*remote
}

// remote is one connected agent: one stream.
type remote struct {
	id      string
	deltas  bool        // it applies deltas
	updates chan Update // to the stream, in order
	mu      sync.Mutex
	head    uint64 // the generation of the last update queued: a delta must start there
	waiters map[uint64][]chan error
	closed  error // set by fail: the agent is gone, Push must not wait
}

// updateQueue bounds the updates queued to one stream. Program waits for
// each acknowledgement, so there is rarely more than one; a stream that
// falls further behind gets the whole state instead.
const updateQueue = 4

// Subscribe registers the agent of a target, which applies deltas or only
// whole states; a newer subscription of the same target replaces an older
// one (an agent that reconnected). The stream starts with the whole state
// of the next programming run. The returned function ends the
// subscription.
func (h *Hub) Subscribe(targetID string, deltas bool) (<-chan Update, func()) {
	r := &remote{id: targetID, deltas: deltas, updates: make(chan Update, updateQueue), waiters: map[uint64][]chan error{}}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[string]*remote{}
	}
	old := h.subs[targetID]
	h.subs[targetID] = r
	h.mu.Unlock()
	if old != nil {
		old.fail(fmt.Errorf("%w: the agent reconnected", errStreamEnded))
	}
	return r.updates, func() {
		h.mu.Lock()
		if h.subs[targetID] == r {
			delete(h.subs, targetID)
		}
		h.mu.Unlock()
		r.fail(fmt.Errorf("%w: the agent disconnected", errStreamEnded))
	}
}

func (h *Hub) get(targetID string) *remote {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[targetID]
}

// Connected reports whether a target's agent is connected.
func (h *Hub) Connected(targetID string) bool { return h.get(targetID) != nil }

// Ack records an agent's acknowledgement: generation gen was applied
// (errMsg ""), or not. The agent applies a stream's updates in order, each
// on top of the one before, so applying gen also settles every older
// generation still waiting.
func (h *Hub) Ack(targetID string, gen uint64, errMsg string) {
	r := h.get(targetID)
	if r == nil {
		return
	}
	var err error
	if errMsg != "" {
		err = fmt.Errorf("target %s did not apply generation %d: %s", targetID, gen, errMsg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for g, ws := range r.waiters {
		if g <= gen {
			for _, w := range ws {
				w <- err
			}
			delete(r.waiters, g)
		}
	}
}

func (r *remote) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = err
	for g, ws := range r.waiters {
		for _, w := range ws {
			w <- err
		}
		delete(r.waiters, g)
	}
}

// forget drops a waiter that stopped waiting (timeout, cancel).
func (r *remote) forget(gen uint64, done chan error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := r.waiters[gen]
	if i := slices.Index(ws, done); i >= 0 {
		ws = slices.Delete(ws, i, i+1)
	}
	if len(ws) == 0 {
		delete(r.waiters, gen)
	} else {
		r.waiters[gen] = ws
	}
}

// push queues u to r's stream and waits for its acknowledgement. A delta
// that does not start where the stream is (or to an agent that takes no
// deltas, or one too far behind) is refused with fabric.ErrNeedFull; a
// whole state replaces what is queued and not yet sent.
func (h *Hub) push(ctx context.Context, r *remote, u Update) error {
	gen := u.Generation()
	done := make(chan error, 1)
	r.mu.Lock()
	if r.closed != nil {
		r.mu.Unlock()
		return fmt.Errorf("target %s: %w", r.id, r.closed)
	}
	if u.Delta != nil && (!r.deltas || u.Delta.Base != r.head) {
		r.mu.Unlock()
		return fmt.Errorf("target %s: the stream is at generation %d, the delta from %d: %w", r.id, r.head, u.Delta.Base, fabric.ErrNeedFull)
	}
	if u.State != nil {
	drain:
		for {
			select {
			case <-r.updates: // older: the whole state supersedes them
			default:
				break drain
			}
		}
	}
	select {
	case r.updates <- u:
	default:
		r.mu.Unlock()
		return fmt.Errorf("target %s: its agent is %d updates behind: %w", r.id, len(r.updates), fabric.ErrNeedFull)
	}
	r.head = gen
	r.waiters[gen] = append(r.waiters[gen], done)
	r.mu.Unlock()
	defer r.forget(gen, done)
	t := h.AckTimeout
	if t == 0 {
		t = 10 * time.Second
	}
	timer := time.NewTimer(t)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("target %s generation %d: %w", r.id, gen, ErrAckTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}
