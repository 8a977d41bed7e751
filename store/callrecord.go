package store

import (
	"context"
	"sync"

	"github.com/nvmegate/nvmegate/audit"
)

// CallRecord carries a call's entry to the first write the call makes on a
// journaled store, which records it in its own commit: the call's entry
// and the change it made are one record, durable together. A call whose
// writes all failed, or that made none, has not used it (Index): its
// caller records it then, as before (nothing changed in the store).
type CallRecord struct {
	Entry audit.Entry

	mu    sync.Mutex
	taken bool // a write is recording it
	used  bool
	index uint64
}

type callRecordKey struct{}

// WithCallRecord returns ctx carrying r to the call's writes.
func WithCallRecord(ctx context.Context, r *CallRecord) context.Context {
	return context.WithValue(ctx, callRecordKey{}, r)
}

// Index is the log index of r's entry, once a write recorded it.
func (r *CallRecord) Index() (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.index, r.used
}

// take claims r for one write; false if another has it or had it.
func (r *CallRecord) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.taken {
		return false
	}
	r.taken = true
	return true
}

// settle records how the write that took r ended: recorded at index, or
// not (then a later write of the call may take it).
func (r *CallRecord) settle(index uint64, recorded bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used, r.index, r.taken = recorded, index, recorded
}

// callEntries are the entries a write records: its own, or else the
// call's record if no write took it yet (settle reports the outcome).
func callEntries(ctx context.Context, entries []audit.Entry) ([]audit.Entry, *CallRecord) {
	if len(entries) > 0 {
		return entries, nil
	}
	r, _ := ctx.Value(callRecordKey{}).(*CallRecord)
	if r == nil || !r.take() {
		return nil, nil
	}
	return []audit.Entry{r.Entry}, r
}
