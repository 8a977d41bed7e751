package authz

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// canon writes the canonical encoding of policy input values, which the
// memo keys of split decisions hash (split.go). The encoding is injective:
// two values with the same encoding convert to the same OPA value, so a
// key names exactly one input. (The converse need not hold: int64(1) and
// uint64(1) encode differently and convert alike, which only costs a memo
// miss.) Objects are written in key order, so a Go map's iteration order
// does not matter; every element is tagged and every length written, so no
// two sequences of values run together.
type canon struct{ b []byte }

// Tags of the encoding.
const (
	tNull    = 'n'
	tFalse   = 'f'
	tTrue    = 't'
	tString  = 's'
	tInt     = 'i' // int, int64: zig-zag varint
	tUint    = 'u' // uint64: varint
	tFloat   = 'd' // float64: IEEE 754 bits
	tJSONNum = 'j' // json.Number: its text
	tArray   = 'a'
	tObject  = 'o' // map[string]any: length, then key-value pairs in key order
	tPicked  = 'p' // an object narrowed to known keys: a presence byte and value per key
	tAST     = 'x' // any other Go value: its OPA value (astValue)
	tAbsent  = '-'
	tPresent = '+'
)

var canonPool = sync.Pool{New: func() any { return &canon{b: make([]byte, 0, 4096)} }}

func getCanon() *canon { c := canonPool.Get().(*canon); c.b = c.b[:0]; return c }

func putCanon(c *canon) {
	if cap(c.b) <= 1<<20 { // a giant input's buffer is not kept
		canonPool.Put(c)
	}
}

func (c *canon) tag(t byte) { c.b = append(c.b, t) }

func (c *canon) str(s string) {
	c.b = append(c.b, tString)
	c.b = binary.AppendUvarint(c.b, uint64(len(s)))
	c.b = append(c.b, s...)
}

func (c *canon) bytes(p []byte) {
	c.b = binary.AppendUvarint(c.b, uint64(len(p)))
	c.b = append(c.b, p...)
}

// value writes x, a value as termCache.term converts it.
func (c *canon) value(x any) error {
	switch v := x.(type) {
	case nil:
		c.tag(tNull)
	case bool:
		if v {
			c.tag(tTrue)
		} else {
			c.tag(tFalse)
		}
	case string:
		c.str(v)
	case map[string]any:
		return c.object(v, "", "")
	case []any:
		c.tag(tArray)
		c.b = binary.AppendUvarint(c.b, uint64(len(v)))
		for _, e := range v {
			if err := c.value(e); err != nil {
				return err
			}
		}
	case []string:
		c.tag(tArray)
		c.b = binary.AppendUvarint(c.b, uint64(len(v)))
		for _, e := range v {
			c.str(e)
		}
	case int:
		c.tag(tInt)
		c.b = binary.AppendVarint(c.b, int64(v))
	case int64:
		c.tag(tInt)
		c.b = binary.AppendVarint(c.b, v)
	case uint64:
		c.tag(tUint)
		c.b = binary.AppendUvarint(c.b, v)
	case float64:
		c.tag(tFloat)
		c.b = binary.BigEndian.AppendUint64(c.b, math.Float64bits(v))
	case json.Number:
		c.tag(tJSONNum)
		c.bytes([]byte(v))
	default:
		val, err := ast.InterfaceToValue(x)
		if err != nil {
			return err
		}
		c.tag(tAST)
		c.astValue(val)
	}
	return nil
}

// object writes m without the keys skip1 and skip2 (when not "").
func (c *canon) object(m map[string]any, skip1, skip2 string) error {
	// Keys and values on the stack for the records of a request (at most a
	// dozen keys each); larger objects spill to the heap.
	var kbuf [16]string
	var vbuf [16]any
	ks, vs := kbuf[:0], vbuf[:0]
	for k, v := range m {
		if skip1 != "" && k == skip1 || skip2 != "" && k == skip2 {
			continue
		}
		ks = append(ks, k)
		vs = append(vs, v)
	}
	for i := 1; i < len(ks); i++ { // insertion sort: a few keys
		for j := i; j > 0 && ks[j] < ks[j-1]; j-- {
			ks[j], ks[j-1] = ks[j-1], ks[j]
			vs[j], vs[j-1] = vs[j-1], vs[j]
		}
	}
	c.tag(tObject)
	c.b = binary.AppendUvarint(c.b, uint64(len(ks)))
	for i, k := range ks {
		c.str(k)
		if err := c.value(vs[i]); err != nil {
			return err
		}
	}
	return nil
}

// shape is the expected form of a record of the resource (policy/README.md):
// its keys, sorted, and the shapes of the records under them (subs, by
// index of keys) or, for an array, of its elements (elem). A map of a known
// shape (no other keys) is written as tShaped and, per key, absent or its
// value: no iteration, no sorting and no key names, which is most of the
// cost of a key. Where a shape applies is fixed by the position in the
// input, so the encoding stays injective; a map with other keys is written
// as object writes it.
type shape struct {
	keys []string
	subs []*shape
	elem *shape
}

const tShaped = 'k'

func newShape(keys []string, subs map[string]*shape) *shape {
	sh := &shape{keys: keys, subs: make([]*shape, len(keys))}
	for i, k := range keys {
		sh.subs[i] = subs[k]
	}
	return sh
}

// Shapes of the records of a connect or renew.
var (
	shapeNamespaces = &shape{elem: newShape(
		[]string{"data_class", "dataset", "mode", "nsid", "qos", "region", "subsystem_nqn", "target", "tenant"},
		map[string]*shape{
			"dataset": newShape([]string{"digest", "name"}, nil),
			"qos":     newShape([]string{"max_iops", "max_mbps"}, nil),
			"target":  newShape([]string{"fabric", "id", "region"}, nil),
		})}
	shapeSubsystem = newShape([]string{"dhchap", "nqn", "target_id", "tenant", "tls"}, nil)
	shapeTarget    = newShape([]string{"driver", "fabric", "id", "region"}, nil)
	// The resource of a caller input: the request's but the namespaces and
	// the subsystem, which valueOf skips.
	shapeCallerResource = newShape(
		[]string{"host_binding", "job", "kind", "ports", "request", "target", "tenant"},
		map[string]*shape{
			"host_binding": newShape([]string{"bound", "host_nqn", "spiffe_id", "subnets", "tenant"}, nil),
			"ports":        {elem: newShape([]string{"id", "subnet"}, nil)},
			"job":          newShape([]string{"allowed_regions", "expires_at", "job_id", "nodes", "scheduler", "state", "tenant"}, nil),
			"request":      newShape([]string{"host_nqn", "mode", "ttl"}, nil),
			"target":       shapeTarget,
		})
)

// valueOf writes x as value does, or by shape sh (may be nil) where x has
// it. skip1 and skip2 are keys of x (an object) to leave out.
func (c *canon) valueOf(x any, sh *shape, skip1, skip2 string) error {
	if sh == nil {
		return c.value(x)
	}
	switch v := x.(type) {
	case map[string]any:
		if sh.keys == nil {
			break
		}
		n := len(v)
		if _, ok := v[skip1]; ok && skip1 != "" {
			n--
		}
		if _, ok := v[skip2]; ok && skip2 != "" {
			n--
		}
		mark := len(c.b)
		c.tag(tShaped)
		found := 0
		for i, k := range sh.keys {
			e, ok := v[k]
			if !ok {
				c.tag(tAbsent)
				continue
			}
			found++
			c.tag(tPresent)
			if err := c.valueOf(e, sh.subs[i], "", ""); err != nil {
				return err
			}
		}
		if found == n {
			return nil
		}
		c.b = c.b[:mark] // other keys: the generic encoding
		return c.object(v, skip1, skip2)
	case []any:
		if sh.elem == nil {
			break
		}
		c.tag(tArray)
		c.b = binary.AppendUvarint(c.b, uint64(len(v)))
		for _, e := range v {
			if err := c.valueOf(e, sh.elem, "", ""); err != nil {
				return err
			}
		}
		return nil
	}
	if m, ok := x.(map[string]any); ok {
		return c.object(m, skip1, skip2)
	}
	return c.value(x)
}

// picked writes x narrowed to keys (sorted, as pick narrows it): an object
// keeps only those keys, anything else is itself.
func (c *canon) picked(x any, keys []string) error {
	m, ok := x.(map[string]any)
	if !ok {
		if _, isObj := mustObject(x); isObj {
			// An object of another Go type: narrowed as its OPA value.
			v, err := pick(x, keys)
			if err != nil {
				return err
			}
			c.tag(tAST)
			c.astValue(v.Value)
			return nil
		}
		return c.value(x)
	}
	c.tag(tPicked)
	for _, k := range keys {
		v, ok := m[k]
		if !ok {
			c.tag(tAbsent)
			continue
		}
		c.tag(tPresent)
		if err := c.value(v); err != nil {
			return err
		}
	}
	return nil
}

// mustObject reports whether x, not a map[string]any, converts to an
// object (a struct, a map of another type); the value is converted only
// for types that could.
func mustObject(x any) (ast.Value, bool) {
	switch x.(type) {
	case nil, bool, string, []any, []string, int, int64, uint64, float64, json.Number:
		return nil, false
	}
	v, err := ast.InterfaceToValue(x)
	if err != nil {
		return nil, false
	}
	_, ok := v.(ast.Object)
	return v, ok
}

// astValue writes an OPA value: for the Go values value does not know.
func (c *canon) astValue(v ast.Value) {
	switch v := v.(type) {
	case ast.Null:
		c.tag(tNull)
	case ast.Boolean:
		if v {
			c.tag(tTrue)
		} else {
			c.tag(tFalse)
		}
	case ast.Number:
		c.tag(tJSONNum)
		c.bytes([]byte(v))
	case ast.String:
		c.str(string(v))
	case *ast.Array:
		c.tag(tArray)
		c.b = binary.AppendUvarint(c.b, uint64(v.Len()))
		for i := range v.Len() {
			c.astValue(v.Elem(i).Value)
		}
	case ast.Object:
		keys := v.Keys()
		slices.SortFunc(keys, func(a, b *ast.Term) int { return ast.Compare(a, b) })
		c.tag(tObject)
		c.b = binary.AppendUvarint(c.b, uint64(len(keys)))
		for _, k := range keys {
			c.astValue(k.Value)
			c.astValue(v.Get(k).Value)
		}
	case ast.Set:
		elems := v.Slice()
		slices.SortFunc(elems, func(a, b *ast.Term) int { return ast.Compare(a, b) })
		c.tag('S')
		c.b = binary.AppendUvarint(c.b, uint64(len(elems)))
		for _, e := range elems {
			c.astValue(e.Value)
		}
	default: // not produced by InterfaceToValue; written so it differs from every other value
		c.tag('?')
		c.str(v.String())
	}
}

// pick converts x and narrows it to keys if it is an object (the Rego
// function narrowed of policy/connect.rego).
func pick(x any, keys []string) (*ast.Term, error) {
	if m, ok := x.(map[string]any); ok {
		tc := termCache{}
		kvs := make([][2]*ast.Term, 0, len(keys))
		for _, k := range keys {
			v, ok := m[k]
			if !ok {
				continue
			}
			t, err := tc.term(v)
			if err != nil {
				return nil, err
			}
			kvs = append(kvs, [2]*ast.Term{tc.str(k), t})
		}
		return ast.NewTerm(ast.NewObject(kvs...)), nil
	}
	t, err := termCache{}.term(x)
	if err != nil {
		return nil, err
	}
	if obj, ok := t.Value.(ast.Object); ok {
		out := ast.NewObject()
		for _, k := range keys {
			if v := obj.Get(ast.StringTerm(k)); v != nil {
				out.Insert(ast.StringTerm(k), v)
			}
		}
		return ast.NewTerm(out), nil
	}
	return t, nil
}
