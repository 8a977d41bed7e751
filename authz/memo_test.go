package authz

import "testing"

// TestMemoGenerations: a memo holds at most two generations; what is used
// stays, what is not ages out.
func TestMemoGenerations(t *testing.T) {
	m := newMemo[int](4)
	key := func(i int) [32]byte { return [32]byte{byte(i)} }
	for i := range 4 {
		m.put(key(i), i)
	}
	m.put(key(4), 4) // the first generation becomes the previous one
	if v, ok := m.get(key(0)); !ok || v != 0 {
		t.Fatalf("entry of the previous generation: %v %v", v, ok)
	}
	for i := 5; i < 8; i++ { // key 0 was moved into the current generation
		m.put(key(i), i)
	}
	m.put(key(8), 8) // a new generation: 1, 2, 3 were not used, they are gone
	for i, want := range map[int]bool{0: true, 1: false, 2: false, 3: false, 5: true, 8: true} {
		if _, ok := m.get(key(i)); ok != want {
			t.Errorf("key %d: present %t, want %t", i, ok, want)
		}
	}
	if n := m.len(); n > 8 {
		t.Errorf("%d entries, bound 2*4", n)
	}
}
