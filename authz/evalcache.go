package authz

import (
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// evalCache is a node decision's cache of rule values (topdown.VirtualCache)
// and data reads (topdown.BaseCache), pooled across evaluations. topdown's
// own caches are tries of hash maps, built anew for every evaluation: a
// dozen allocations before the first rule. A node decision that allows
// caches a handful of refs, so here each stack frame is a slice searched
// from the end, indexed by hash only once it grows (a deny evaluates many
// rules). The semantics are topdown's: Get on the top frame only, exact
// refs, and a ref once marked undefined stays so.
type evalCache struct {
	frames []cacheFrame
	base   []baseEntry
}

type cacheFrame struct {
	entries []cacheEntry
	index   map[int][]int // ref hash → entries, once entries is long
}

type cacheEntry struct {
	ref       ast.Ref
	value     *ast.Term
	undefined bool
}

type baseEntry struct {
	ref   ast.Ref
	value ast.Value
}

const cacheIndexAt = 16

var evalCaches = sync.Pool{New: func() any { return &evalCache{} }}

// getEvalCache returns an empty cache with one frame.
func getEvalCache() *evalCache {
	c := evalCaches.Get().(*evalCache)
	c.Push()
	return c
}

// release empties c (dropping its references) and pools it.
func (c *evalCache) release() {
	for i := range c.frames {
		clear(c.frames[i].entries)
		c.frames[i].entries = c.frames[i].entries[:0]
		c.frames[i].index = nil
	}
	c.frames = c.frames[:0]
	clear(c.base)
	c.base = c.base[:0]
	evalCaches.Put(c)
}

func (c *evalCache) Push() {
	if len(c.frames) < cap(c.frames) {
		c.frames = c.frames[:len(c.frames)+1]
		return
	}
	c.frames = append(c.frames, cacheFrame{})
}

func (c *evalCache) Pop() {
	f := &c.frames[len(c.frames)-1]
	clear(f.entries)
	f.entries, f.index = f.entries[:0], nil
	c.frames = c.frames[:len(c.frames)-1]
}

func (f *cacheFrame) find(ref ast.Ref) int {
	if f.index != nil {
		for _, i := range f.index[ref.Hash()] {
			if f.entries[i].ref.Equal(ref) {
				return i
			}
		}
		return -1
	}
	for i := len(f.entries) - 1; i >= 0; i-- {
		if f.entries[i].ref.Equal(ref) {
			return i
		}
	}
	return -1
}

func (c *evalCache) Get(ref ast.Ref) (*ast.Term, bool) {
	f := &c.frames[len(c.frames)-1]
	i := f.find(ref)
	if i < 0 {
		return nil, false
	}
	if e := &f.entries[i]; e.undefined {
		return nil, true
	} else {
		return e.value, false
	}
}

func (c *evalCache) Put(ref ast.Ref, value *ast.Term) {
	f := &c.frames[len(c.frames)-1]
	i := f.find(ref)
	if i < 0 {
		i = len(f.entries)
		// topdown may reuse the ref's backing array: keep a copy.
		f.entries = append(f.entries, cacheEntry{ref: slices.Clone(ref)})
		switch {
		case f.index != nil:
			h := ref.Hash()
			f.index[h] = append(f.index[h], i)
		case len(f.entries) > cacheIndexAt:
			f.index = make(map[int][]int, 2*len(f.entries))
			for j, e := range f.entries {
				h := e.ref.Hash()
				f.index[h] = append(f.index[h], j)
			}
		}
	}
	if e := &f.entries[i]; value != nil {
		e.value = value
	} else {
		e.undefined = true
	}
}

func (c *evalCache) Keys() []ast.Ref {
	var keys []ast.Ref
	for _, e := range c.frames[len(c.frames)-1].entries {
		if e.value != nil {
			keys = append(keys, e.ref)
		}
	}
	return keys
}

// baseCache is the BaseCache of a node decision: data reads by ref. A
// value read at a prefix of ref serves ref (as topdown's base cache).
type baseCache evalCache

func (c *baseCache) Get(ref ast.Ref) ast.Value {
	for _, e := range c.base {
		if ref.HasPrefix(e.ref) {
			if len(ref) == len(e.ref) {
				return e.value
			}
			v, err := e.value.Find(ref[len(e.ref):])
			if err != nil {
				return nil
			}
			return v
		}
	}
	return nil
}

func (c *baseCache) Put(ref ast.Ref, value ast.Value) {
	c.base = append(c.base, baseEntry{slices.Clone(ref), value})
}

var (
	_ topdown.VirtualCache = (*evalCache)(nil)
	_ topdown.BaseCache    = (*baseCache)(nil)
)
