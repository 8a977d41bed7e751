package store

import (
	"bytes"
	"sync"
)

// decodeMemo keeps records decoded by key, with the bytes they were decoded
// from: a record read again with the same bytes is not decoded again, and
// a changed record (other bytes) is. Under a connect storm the same grants
// and jobs are read on every call; decoding their JSON was a large part of
// the cost. Past max entries the memo starts over.
type decodeMemo[T any] struct {
	mu  sync.Mutex
	m   map[string]memoEntry[T]
	max int
}

type memoEntry[T any] struct {
	raw []byte
	v   T
}

// get returns a copy of what decode made of raw (the record at key).
func (m *decodeMemo[T]) get(key string, raw []byte, decode func([]byte) (*T, error)) (*T, error) {
	m.mu.Lock()
	e, ok := m.m[key]
	m.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		v := e.v
		return &v, nil
	}
	v, err := decode(raw)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.m == nil || len(m.m) >= m.max {
		m.m = map[string]memoEntry[T]{}
	}
	m.m[key] = memoEntry[T]{raw: bytes.Clone(raw), v: *v}
	m.mu.Unlock()
	return v, nil
}
