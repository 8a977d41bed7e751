package authz

import "sync"

// memo is a bounded map from SHA-256 keys to memoized decisions, for one
// policy revision. It keeps two generations: entries go into the current
// one; when it holds max entries it becomes the previous one (the one
// before is dropped) and a new current one starts. A hit in the previous
// generation moves the entry back into the current one, so what is in use
// stays and what is not ages out: at most 2*max entries, O(1) per call,
// without the bookkeeping of an LRU list.
//
// A key is the hash of everything the memoized decision depends on (its
// input, the policy revision and the data), so an entry is never stale:
// a changed record is a new key, and a new revision gets a new memo.
type memo[V any] struct {
	mu        sync.RWMutex
	max       int
	cur, prev map[[32]byte]V
}

func newMemo[V any](max int) *memo[V] {
	return &memo[V]{max: max, cur: make(map[[32]byte]V, 64)}
}

// get returns the entry of k, if there is one.
func (m *memo[V]) get(k [32]byte) (V, bool) {
	m.mu.RLock()
	v, ok := m.cur[k]
	if ok {
		m.mu.RUnlock()
		return v, true
	}
	v, ok = m.prev[k]
	m.mu.RUnlock()
	if ok {
		m.put(k, v)
	}
	return v, ok
}

// put stores v at k.
func (m *memo[V]) put(k [32]byte, v V) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.cur) >= m.max {
		m.prev, m.cur = m.cur, make(map[[32]byte]V, 64)
	}
	m.cur[k] = v
}

// len is the number of entries (tests).
func (m *memo[V]) len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.cur) + len(m.prev)
}
