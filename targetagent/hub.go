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

// ErrAckTimeout is returned by Push when the target's agent did not
// acknowledge the state in time.
var ErrAckTimeout = errors.New("targetagent: the target's agent did not acknowledge in time")

// Hub connects remote target agents (cmd/nvmegate-target): while a
// target's agent is connected, Program sends it the state and waits for
// its acknowledgement instead of applying it locally.
type Hub struct {
	// AckTimeout bounds the wait for an acknowledgement; default 10s.
	AckTimeout time.Duration

	mu   sync.Mutex
	subs map[string]*remote
}

// remote is one connected agent.
type remote struct {
	states  chan fabric.State // capacity 1: a newer state replaces one not yet sent
	mu      sync.Mutex
	waiters map[uint64][]chan error
	closed  error // set by fail: the agent is gone, Push must not wait
}

// Subscribe registers the agent of a target; a newer subscription of the
// same target replaces an older one (an agent that reconnected). The
// returned function ends the subscription.
func (h *Hub) Subscribe(targetID string) (<-chan fabric.State, func()) {
	r := &remote{states: make(chan fabric.State, 1), waiters: map[uint64][]chan error{}}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[string]*remote{}
	}
	old := h.subs[targetID]
	h.subs[targetID] = r
	h.mu.Unlock()
	if old != nil {
		old.fail(errors.New("targetagent: the agent reconnected"))
	}
	return r.states, func() {
		h.mu.Lock()
		if h.subs[targetID] == r {
			delete(h.subs, targetID)
		}
		h.mu.Unlock()
		r.fail(errors.New("targetagent: the agent disconnected"))
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
// (errMsg ""), or not. A state is a whole snapshot, so applying gen also
// settles every older generation still waiting.
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

// Push sends st to the target's agent and waits for its acknowledgement.
func (h *Hub) Push(ctx context.Context, targetID string, st fabric.State) error {
	r := h.get(targetID)
	if r == nil {
		return fmt.Errorf("target %s: %w", targetID, ErrNotManaged)
	}
	done := make(chan error, 1)
	r.mu.Lock()
	if r.closed != nil {
		r.mu.Unlock()
		return fmt.Errorf("target %s: %w", targetID, r.closed)
	}
	r.waiters[st.Generation] = append(r.waiters[st.Generation], done)
	r.mu.Unlock()
	defer r.forget(st.Generation, done)
	// Replace a state the agent has not taken yet: it is older.
	select {
	case <-r.states:
	default:
	}
	r.states <- st
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
		return fmt.Errorf("target %s generation %d: %w", targetID, st.Generation, ErrAckTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}
