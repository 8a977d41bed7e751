package targetagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
	// Revision is the store revision the update reflects, read after it
	// was built (it holds no later change): comparable across the
	// replicas of one store, so an agent can refuse a state older than
	// one it applied. 0: unknown.
	Revision uint64
}

// Generation is the generation the update brings the target to.
func (u Update) Generation() uint64 {
	if u.Delta != nil {
		return u.Delta.Generation
	}
	return u.State.Generation
}

// ErrAgentConnected refuses a second stream of a target while its first
// is live (Subscribe).
var ErrAgentConnected = errors.New("targetagent: the target already has a connected agent")

// ErrNotLiveStream refuses an acknowledgement that did not come from the
// target's live stream (Ack): a stream the hub ended, or another agent's.
var ErrNotLiveStream = errors.New("targetagent: not the target's live stream")

// Hub connects remote target agents (cmd/nvmegate-target): while a
// target's agent is connected, Program sends it the target's state — whole
// first, then deltas if it accepts them — and waits for its
// acknowledgement instead of applying it locally.
//
// A target has at most one live stream (see the package doc): a second
// subscription is refused while the first is live, acknowledgements count
// only from the live stream, and the hub ends a stream that stops taking
// state — one that did not acknowledge in time or failed to apply — so
// that its agent reconnects, rather than leave it connected and deaf.
type Hub struct {
	// AckTimeout bounds the wait for an acknowledgement; default 10s. A
	// stream that misses it is ended.
	AckTimeout time.Duration

	mu   sync.Mutex
	subs map[string]*remote
	// attach holds, per target, a channel closed when an agent of the
	// target next subscribes (attaching).
	attach map[string]chan struct{}
}

// attaching returns a channel closed when an agent of targetID next
// subscribes here.
func (h *Hub) attaching(targetID string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.attach == nil {
		h.attach = map[string]chan struct{}{}
	}
	ch := h.attach[targetID]
	if ch == nil {
		ch = make(chan struct{})
		h.attach[targetID] = ch
	}
	return ch
}

// remote is one connected agent: one stream.
type remote struct {
	id      string // the target
	stream  string // random: names this stream in acknowledgements
	since   time.Time
	deltas  bool        // it applies deltas
	updates chan Update // to the stream, in order
	ended   chan struct{}
	mu      sync.Mutex
	head    uint64 // the generation of the last update queued: a delta must start there
	waiters map[uint64][]chan error
	closed  error // set by fail: the agent is gone, Push must not wait
}

// updateQueue bounds the updates queued to one stream. Program waits for
// each acknowledgement, so there is rarely more than one; a stream that
// falls further behind gets the whole state instead.
const updateQueue = 4

// Subscription is a target's live stream as the hub holds it.
type Subscription struct {
	r *remote
	h *Hub
}

// ID names the stream; its acknowledgements carry it.
func (s *Subscription) ID() string { return s.r.stream }

// Updates are the stream's updates, in order.
func (s *Subscription) Updates() <-chan Update { return s.r.updates }

// Ended is closed when the hub ended the stream (Err says why): the
// stream must be closed, and its agent reconnect.
func (s *Subscription) Ended() <-chan struct{} { return s.r.ended }

// Err is why the stream ended, once Ended is closed.
func (s *Subscription) Err() error {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	return s.r.closed
}

// Close ends the subscription (the agent went away); the target is free
// for its next stream.
func (s *Subscription) Close() {
	s.h.end(s.r, fmt.Errorf("%w: the agent disconnected", errStreamEnded))
}

// Subscribe registers the live stream of a target, whose agent applies
// deltas or only whole states. It is refused with ErrAgentConnected while
// another stream of the target is live. The stream starts with the whole
// state of the next programming run.
func (h *Hub) Subscribe(targetID string, deltas bool) (*Subscription, error) {
	b := make([]byte, 12)
	rand.Read(b)
	r := &remote{id: targetID, stream: hex.EncodeToString(b), since: time.Now(), deltas: deltas,
		updates: make(chan Update, updateQueue), ended: make(chan struct{}), waiters: map[uint64][]chan error{}}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[string]*remote{}
	}
	if old := h.subs[targetID]; old != nil {
		return nil, fmt.Errorf("%w: target %s has a stream live since %s; a second agent of one target is refused while the first is live",
			ErrAgentConnected, targetID, old.since.UTC().Format(time.RFC3339))
	}
	h.subs[targetID] = r
	if ch := h.attach[targetID]; ch != nil {
		close(ch)
		delete(h.attach, targetID)
	}
	return &Subscription{r: r, h: h}, nil
}

// end ends r: it is no longer the target's stream, its waiters fail with
// err, and Ended tells its Watch to close it. Idempotent.
func (h *Hub) end(r *remote, err error) {
	h.mu.Lock()
	if h.subs[r.id] == r {
		delete(h.subs, r.id)
	}
	h.mu.Unlock()
	if r.fail(err) {
		close(r.ended)
	}
}

func (h *Hub) get(targetID string) *remote {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.subs[targetID]
}

// Attached returns the targets whose agents stream from this hub.
func (h *Hub) Attached() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.subs))
	for id := range h.subs {
		out = append(out, id)
	}
	return out
}

// Streams returns the live stream of each target whose agent streams from
// this hub: target ID → stream ID (a reconnection is a new stream).
func (h *Hub) Streams() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]string, len(h.subs))
	for id, r := range h.subs {
		out[id] = r.stream
	}
	return out
}

// Connected reports whether a target's agent is connected.
func (h *Hub) Connected(targetID string) bool { return h.get(targetID) != nil }

// Live reports whether stream is the target's live stream.
func (h *Hub) Live(targetID, stream string) bool {
	r := h.get(targetID)
	return r != nil && stream != "" && r.stream == stream
}

// Ack records an acknowledgement from stream of a target: generation gen
// was applied (errMsg ""), or not. The agent applies a stream's updates in
// order, each on top of the one before, so applying gen also settles every
// older generation still waiting. A failed application ends the stream:
// what its target holds is unknown, and the agent's next stream starts
// with the whole state. An acknowledgement from any stream but the
// target's live one is refused with ErrNotLiveStream.
//
// notServed, with an empty errMsg, are namespaces the agent could not
// serve (fabric.NotServedError): the generation is applied otherwise, its
// waiters get a *fabric.NotServedError — a success for their hosts, which
// the agent reports — and the stream stays.
func (h *Hub) Ack(targetID, stream string, gen uint64, errMsg string, notServed ...fabric.NotServed) error {
	r := h.get(targetID)
	if r == nil || stream == "" || r.stream != stream {
		return fmt.Errorf("%w: target %s, acknowledgement of generation %d", ErrNotLiveStream, targetID, gen)
	}
	var err, result error
	switch {
	case errMsg != "":
		err = fmt.Errorf("target %s did not apply generation %d: %s", targetID, gen, errMsg)
		result = err
	case len(notServed) > 0:
		result = &fabric.NotServedError{Namespaces: slices.Clone(notServed)}
	}
	r.mu.Lock()
	if gen > r.head {
		// Acknowledging what was never sent would settle waiters for
		// states the agent cannot have applied.
		r.mu.Unlock()
		return fmt.Errorf("%w: target %s acknowledged generation %d, its stream is at %d", ErrNotLiveStream, targetID, gen, r.head)
	}
	for g, ws := range r.waiters {
		if g <= gen {
			for _, w := range ws {
				w <- result
			}
			delete(r.waiters, g)
		}
	}
	r.mu.Unlock()
	if err != nil {
		h.end(r, fmt.Errorf("%w: %w", errStreamEnded, err))
	}
	return nil
}

// fail fails r's waiters with err and every later push; it reports
// whether r was live until now.
func (r *remote) fail(err error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed != nil {
		return false
	}
	r.closed = err
	for g, ws := range r.waiters {
		for _, w := range ws {
			w <- err
		}
		delete(r.waiters, g)
	}
	return true
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
		// A stream that takes no state is no use connected: end it, so
		// that its agent reconnects and starts over with the whole state.
		err := fmt.Errorf("target %s generation %d: %w after %s", r.id, gen, ErrAckTimeout, t)
		h.end(r, fmt.Errorf("%w: %w", errStreamEnded, err))
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
