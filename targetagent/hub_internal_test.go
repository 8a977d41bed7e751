package targetagent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
)

func whole(gen uint64) Update { return Update{State: &fabric.State{Generation: gen}} }

// pushAsync pushes u to target t1's live stream and returns its result.
func pushAsync(h *Hub, u Update) <-chan error {
	out := make(chan error, 1)
	go func() {
		r := h.get("t1")
		if r == nil {
			out <- errors.New("no live stream")
			return
		}
		out <- h.push(context.Background(), r, u)
	}()
	return out
}

func recv(t *testing.T, s *Subscription) Update {
	t.Helper()
	select {
	case u := <-s.Updates():
		return u
	case <-time.After(5 * time.Second):
		t.Fatal("no update")
	}
	return Update{}
}

func ended(t *testing.T, s *Subscription) error {
	t.Helper()
	select {
	case <-s.Ended():
		return s.Err()
	case <-time.After(5 * time.Second):
		t.Fatal("the stream was not ended")
	}
	return nil
}

// One live stream per target: a second is refused while the first is
// live, and gets in once it ends.
func TestHubOneStreamPerTarget(t *testing.T) {
	h := &Hub{}
	first, err := h.Subscribe("t1", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Subscribe("t1", true); !errors.Is(err, ErrAgentConnected) {
		t.Fatalf("second stream: %v, want ErrAgentConnected", err)
	}
	if _, err := h.Subscribe("t2", true); err != nil {
		t.Fatalf("another target's stream: %v", err)
	}
	first.Close()
	second, err := h.Subscribe("t1", true)
	if err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	if second.ID() == first.ID() {
		t.Fatal("two streams with one ID")
	}
	// The first stream's Close, late, does not end the second.
	first.Close()
	if !h.Connected("t1") {
		t.Fatal("a stale Close ended the live stream")
	}
}

// Only the live stream's acknowledgement settles a push; another's is
// refused and settles nothing.
func TestHubAckOnlyFromTheLiveStream(t *testing.T) {
	h := &Hub{AckTimeout: 5 * time.Second}
	s, err := h.Subscribe("t1", true)
	if err != nil {
		t.Fatal(err)
	}
	res := pushAsync(h, whole(7))
	u := recv(t, s)
	for _, stream := range []string{"", "someone-else"} {
		if err := h.Ack("t1", stream, u.Generation(), ""); !errors.Is(err, ErrNotLiveStream) {
			t.Fatalf("ack from stream %q: %v, want ErrNotLiveStream", stream, err)
		}
	}
	select {
	case err := <-res:
		t.Fatalf("a foreign acknowledgement settled the push: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	// Nor may the live stream acknowledge a generation never sent to it.
	if err := h.Ack("t1", s.ID(), u.Generation()+1, ""); !errors.Is(err, ErrNotLiveStream) {
		t.Fatalf("ack of an unsent generation: %v, want ErrNotLiveStream", err)
	}
	if err := h.Ack("t1", s.ID(), u.Generation(), ""); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("acknowledged push: %v", err)
	}
}

// A stream that does not acknowledge in time, or fails to apply, is ended
// — it is not left connected and deaf — and the target is free for its
// agent's next stream.
func TestHubEndsAStreamThatTakesNoState(t *testing.T) {
	h := &Hub{AckTimeout: 20 * time.Millisecond}
	s, err := h.Subscribe("t1", true)
	if err != nil {
		t.Fatal(err)
	}
	res := pushAsync(h, whole(1))
	recv(t, s)
	if err := <-res; !errors.Is(err, ErrAckTimeout) {
		t.Fatalf("unacknowledged push: %v, want ErrAckTimeout", err)
	}
	if err := ended(t, s); !errors.Is(err, ErrAckTimeout) {
		t.Fatalf("ended because %v, want the timeout", err)
	}
	if h.Connected("t1") {
		t.Fatal("an ended stream is still the target's")
	}
	if err := h.Ack("t1", s.ID(), 1, ""); !errors.Is(err, ErrNotLiveStream) {
		t.Fatalf("late ack of an ended stream: %v", err)
	}

	h.AckTimeout = 5 * time.Second
	s2, err := h.Subscribe("t1", true)
	if err != nil {
		t.Fatal(err)
	}
	res = pushAsync(h, whole(2))
	u := recv(t, s2)
	if err := h.Ack("t1", s2.ID(), u.Generation(), "disk on fire"); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err == nil {
		t.Fatal("a failed application answered success")
	}
	if err := ended(t, s2); err == nil || h.Connected("t1") {
		t.Fatalf("a stream that failed to apply is still live: %v", err)
	}
}
