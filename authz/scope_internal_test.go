package authz

import (
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// keyed is everything a split decision's memo keys and inputs are made of
// when the resource is typed: the call and its Scope.
type keyed struct {
	Caller Caller
	RPC    RPC
	Action string
	GW     Gateway
	Scope  Scope
}

func (k *keyed) input() *Input {
	return &Input{Caller: k.Caller, RPC: k.RPC, Action: k.Action, Scope: &k.Scope}
}

// keys are the canonical bytes of k's scope key and caller key, as
// decideSplit writes them (without the revision's tag).
func (k *keyed) keys() (scope, caller string) {
	c := &canon{}
	c.typedScope(k.Action, &k.Scope)
	scope = string(c.b)
	c.typedCaller(k.input(), k.Action, k.GW, &k.Scope)
	return scope, string(c.b)
}

// sealedKeys are keys with k's scope sealed (Scope.Sealed).
func (k *keyed) sealedKeys() (scope, caller string) {
	sealed := *k
	sealed.Scope = *k.Scope.Sealed()
	return sealed.keys()
}

// values are the parts' inputs k's keys name: the scope input, and the
// caller input with the scope input in place of the scope decision (which
// is a function of it).
func (k *keyed) values(t *testing.T) (scope, caller ast.Value) {
	t.Helper()
	scope = typedScopeValue(k.Action, &k.Scope)
	items, err := callerInputItems(k.input(), k.Action, k.GW, ast.NewTerm(scope))
	if err != nil {
		t.Fatal(err)
	}
	return scope, ast.NewObject(items...)
}

func (k *keyed) clone() *keyed {
	c := *k
	c.Scope = k.Scope.clone()
	return &c
}

// fullKeyed has every record of a scope present and every field set, so
// that every field is one the parts' inputs hold.
func fullKeyed() *keyed {
	return &keyed{
		Caller: Caller{ID: "spiffe://example.org/node/n1", TrustDomain: "example.org", Role: RoleNode, Name: "n1"},
		RPC:    ParseFullMethod("/nvmegate.v1.Access/Connect"), Action: "access.connect", GW: Gateway{TrustDomain: "example.org"},
		Scope: Scope{
			Kind: "job", Tenant: "acme",
			Job: ScopeJob{ID: "j1", Found: true, Tenant: "acme", Scheduler: "spiffe://example.org/tenant/acme/scheduler/s",
				Nodes: []string{"spiffe://example.org/node/n1"}, AllowedRegions: []string{"eu-west", "eu-central"},
				ExpiresAt: time.Date(2026, 10, 2, 0, 0, 0, 500, time.UTC), State: "active"},
			Binding: ScopeBinding{SPIFFEID: "spiffe://example.org/node/n1", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1", Tenant: "acme", Bound: true,
				Subnets: []string{"10.0.0.0/16"}},
			Ports:     []ScopePort{{ID: 1, Subnet: "10.0.1.0/24"}, {ID: 2}},
			Request:   ScopeRequest{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1", TTL: "2h", Mode: "ro"},
			Subsystem: ScopeSubsystem{NQN: "nqn.s", Found: true, Tenant: "acme", TargetID: "t1", DHCHAP: true, TLS: true},
			Target:    &ScopeTarget{ID: "t1", Region: "eu-west", Fabric: "f1", Driver: "nvmet"},
			Namespaces: []ScopeNamespace{
				{SubsystemNQN: "nqn.s", NSID: 1, Mode: "ro", Found: true, Tenant: "acme", Region: "eu-west", DataClass: "internal",
					DatasetName: "ds", DatasetDigest: "sha256:00", MaxIOPS: 100, MaxMBps: 10, Placed: true,
					Target: ScopePlacement{ID: "t1", Region: "eu-west", Fabric: "f1"}},
				{SubsystemNQN: "nqn.s", NSID: 2, Mode: "rw", Found: true, Tenant: "acme", Region: "eu-west", DataClass: "public",
					DatasetName: "ds2", DatasetDigest: "sha256:01", Placed: true, Target: ScopePlacement{ID: "t1", Region: "eu-west", Fabric: "f1"}},
			},
		},
	}
}

// leaves calls f with the path of every leaf of v (a string, bool,
// integer or time; a pointer and a slice are leaves too, for their
// presence and length) and the value, settable.
func leaves(v reflect.Value, path string, f func(path string, v reflect.Value)) {
	switch v.Kind() {
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			f(path, v)
			return
		}
		for i := range v.NumField() {
			if !v.Type().Field(i).IsExported() { // Scope's seal: not a field of the input
				continue
			}
			leaves(v.Field(i), path+"."+v.Type().Field(i).Name, f)
		}
	case reflect.Pointer:
		f(path, v)
		if !v.IsNil() {
			leaves(v.Elem(), path, f)
		}
	case reflect.Slice:
		f(path, v)
		for i := range v.Len() {
			leaves(v.Index(i), fmt.Sprintf("%s[%d]", path, i), f)
		}
	default:
		f(path, v)
	}
}

// mutate changes leaf v to another value drawn from small domains (so that
// draws repeat); with r nil, to a value that differs for sure.
func mutate(v reflect.Value, r *rand.Rand) {
	pick := func(n int) int {
		if r == nil {
			return 0
		}
		return r.IntN(n)
	}
	switch v.Kind() {
	case reflect.String:
		s := v.String()
		if r == nil {
			v.SetString(s + "x")
			return
		}
		// Values that run into each other if lengths were not written.
		v.SetString([]string{"", "a", "ab", "b", "\x00", s + "a", s[:len(s)/2]}[r.IntN(7)])
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1 + uint64(pick(2)))
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		} else {
			v.SetZero()
		}
	case reflect.Slice:
		if v.Len() > 0 && pick(2) == 0 {
			v.Set(v.Slice(0, v.Len()-1))
		} else {
			v.Set(reflect.Append(v, reflect.Zero(v.Type().Elem())))
		}
	case reflect.Struct: // time.Time
		t := v.Interface().(time.Time)
		v.Set(reflect.ValueOf([]time.Time{t.Add(1), t.Add(time.Second), t.In(time.FixedZone("X", 3600)).Add(time.Nanosecond)}[pick(3)]))
	default:
		panic("cannot mutate " + v.Kind().String())
	}
}

// nthLeaf is the i-th leaf of k, in leaves' order.
func nthLeaf(k *keyed, i int) (string, reflect.Value, bool) {
	var (
		path string
		leaf reflect.Value
		n    int
	)
	leaves(reflect.ValueOf(k).Elem(), "", func(p string, v reflect.Value) {
		if n == i {
			path, leaf = p, v
		}
		n++
	})
	return path, leaf, leaf.IsValid()
}

// Every field of a typed scope (and of the call) that the caller decision
// can read changes its memo key, and every field the scope decision can
// read changes the scope's; a field of the caller's part leaves the scope
// key alone, so that all nodes of a job share their scope's memo.
func TestTypedKeysCoverEveryField(t *testing.T) {
	base := fullKeyed()
	baseScope, baseCaller := base.keys()
	sealedScope, sealedCaller := base.sealedKeys()
	sv, cv := base.values(t)
	callerOnly := 0
	for i := 0; ; i++ {
		k := base.clone()
		path, leaf, ok := nthLeaf(k, i)
		if !ok {
			if i < 50 {
				t.Fatalf("only %d leaves", i)
			}
			break
		}
		mutate(leaf, nil)
		s, c := k.keys()
		sv2, cv2 := k.values(t)
		if c == baseCaller || cv2.Compare(cv) == 0 {
			t.Errorf("%s changed: caller key changed %t, caller input changed %t; want both", path, c != baseCaller, cv2.Compare(cv) != 0)
		}
		if (s != baseScope) != (sv2.Compare(sv) != 0) {
			t.Errorf("%s changed: scope key changed %t, scope input changed %t", path, s != baseScope, sv2.Compare(sv) != 0)
		}
		if s == baseScope {
			callerOnly++
		}
		// Sealed, the scope part is its digest: the keys change alike.
		if ss, sc := k.sealedKeys(); (ss != sealedScope) != (s != baseScope) || (sc != sealedCaller) != (c != baseCaller) {
			t.Errorf("%s changed: sealed scope key changed %t, caller key %t; unsealed %t, %t", path, ss != sealedScope, sc != sealedCaller, s != baseScope, c != baseCaller)
		}
	}
	// The caller's own: the caller (5), the RPC (3), the gateway, the kind,
	// the job's scheduler, nodes (the list and its one element), expiry
	// and state, the binding (4, and its subnets: the list and its one
	// element), the request's host NQN and TTL, the ports (the list and
	// the id and subnet of its two).
	if callerOnly != 28 {
		t.Errorf("%d fields are the caller's alone, want 28", callerOnly)
	}
}

// Over 10,000 scopes drawn near each other (a few fields changed from one of two
// bases, from small domains, so that draws repeat): two calls have the
// same caller key exactly when the parts' inputs it names are the same,
// and the same scope key exactly when the scope inputs are. The first is
// what makes a memoized caller decision exactly the answer; the second
// that no caller is decided anew for nothing.
func TestTypedKeysAreExact(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	sparse := fullKeyed()
	sparse.Scope.Job = ScopeJob{ID: "j1", Tenant: "hidden", State: "hidden"}
	sparse.Scope.Subsystem.Found, sparse.Scope.Target, sparse.Scope.Ports = false, nil, nil
	sparse.Scope.Namespaces[0].Found, sparse.Scope.Namespaces[1].Placed = false, false
	callers := map[string]ast.Value{}
	scopes := map[string]ast.Value{}
	repeats := 0
	for range 10000 {
		base := fullKeyed()
		if r.IntN(2) == 0 {
			base = sparse
		}
		k := base.clone()
		for range 1 + r.IntN(3) {
			n := 0
			leaves(reflect.ValueOf(k).Elem(), "", func(string, reflect.Value) { n++ })
			_, leaf, _ := nthLeaf(k, r.IntN(n))
			mutate(leaf, r)
		}
		s, c := k.keys()
		sv, cv := k.values(t)
		if old, ok := callers[c]; ok {
			repeats++
			if old.Compare(cv) != 0 {
				t.Fatalf("one caller key for two inputs:\n%v\n%v", old, cv)
			}
		}
		callers[c] = cv
		if old, ok := scopes[s]; ok && old.Compare(sv) != 0 {
			t.Fatalf("one scope key for two inputs:\n%v\n%v", old, sv)
		}
		scopes[s] = sv
	}
	// And the converse: distinct keys name distinct inputs.
	for name, m := range map[string]map[string]ast.Value{"caller": callers, "scope": scopes} {
		seen := map[string]bool{}
		for _, v := range m {
			if seen[v.String()] {
				t.Errorf("two %s keys for one input %v", name, v)
			}
			seen[v.String()] = true
		}
	}
	t.Logf("%d draws, %d of them a caller key drawn before, %d distinct scope keys", 10000, repeats, len(scopes))
	if repeats < 500 {
		t.Errorf("only %d repeated draws: the test compares too little", repeats)
	}
}

// The typed conversions are the map's: for scopes drawn as above, the
// resource, the scope input and the caller input built from the Scope
// equal those the engine builds from the map the Scope describes
// (ResourceMap, which the gateway's test holds to the gateway's map).
func TestTypedValuesAreTheMaps(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for i := range 3000 {
		k := fullKeyed()
		for range r.IntN(6) {
			n := 0
			leaves(reflect.ValueOf(k).Elem(), "", func(string, reflect.Value) { n++ })
			_, leaf, _ := nthLeaf(k, r.IntN(n))
			mutate(leaf, r)
		}
		typed := k.input()
		m := typed.ResourceMap()
		byMap := &Input{Caller: k.Caller, RPC: k.RPC, Action: k.Action, Resource: m}

		want, err := termCache{}.term(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := typedResource(&k.Scope); got.Compare(want.Value) != 0 {
			t.Fatalf("%d: resource\n typed %v\n map   %v", i, got, want)
		}
		wantScope, err := scopeInputValue(k.Action, m)
		if err != nil {
			t.Fatal(err)
		}
		if got := typedScopeValue(k.Action, &k.Scope); got.Compare(wantScope) != 0 {
			t.Fatalf("%d: scope input\n typed %v\n map   %v", i, got, wantScope)
		}
		sd := ast.NewTerm(wantScope)
		got, err := callerInputItems(typed, k.Action, k.GW, sd)
		if err != nil {
			t.Fatal(err)
		}
		wantCaller, err := callerInputItems(byMap, k.Action, k.GW, sd)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := ast.NewObject(got...), ast.NewObject(wantCaller...); g.Compare(w) != 0 {
			t.Fatalf("%d: caller input\n typed %v\n map   %v", i, g, w)
		}
		// And the whole input of a decision not made in parts.
		now := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
		gv, err := typed.value(k.GW, now)
		if err != nil {
			t.Fatal(err)
		}
		wv, err := byMap.value(k.GW, now)
		if err != nil {
			t.Fatal(err)
		}
		if gv.Compare(wv) != 0 {
			t.Fatalf("%d: input\n typed %v\n map   %v", i, gv, wv)
		}
	}
}

// BenchmarkCallerKey measures what every split decision spends before its
// memo lookup, the canonical bytes of its caller key (scope and caller
// inputs) and their SHA-256, for a connect of 8 namespaces: from the map
// (shapes), with the scope typed and the caller's part from the map (the
// gateway before it handed the caller's part typed), and all typed.
//
//	go test ./authz/ -run '^$' -bench BenchmarkCallerKey
func BenchmarkCallerKey(b *testing.B) {
	k := fullKeyed()
	for i := 2; len(k.Scope.Namespaces) < 8; i++ {
		ns := k.Scope.Namespaces[0]
		ns.NSID = uint32(i)
		k.Scope.Namespaces = append(k.Scope.Namespaces, ns)
	}
	typed := k.input()
	byMap := &Input{Caller: k.Caller, RPC: k.RPC, Action: k.Action, Resource: typed.ResourceMap()}
	b.Run("map", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := getCanon()
			if err := c.scopeInput(k.Action, byMap.Resource); err != nil {
				b.Fatal(err)
			}
			if err := c.callerInput(byMap, k.Action, k.GW); err != nil {
				b.Fatal(err)
			}
			sha256.Sum256(c.b)
			putCanon(c)
		}
	})
	b.Run("typed-scope", func(b *testing.B) { // the caller's part from the map
		half := *byMap
		half.Scope = typed.Scope
		b.ReportAllocs()
		for b.Loop() {
			c := getCanon()
			c.typedScope(k.Action, typed.Scope)
			if err := c.callerInput(&half, k.Action, k.GW); err != nil {
				b.Fatal(err)
			}
			sha256.Sum256(c.b)
			putCanon(c)
		}
	})
	b.Run("typed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c := getCanon()
			c.typedScope(k.Action, typed.Scope)
			c.typedCaller(typed, k.Action, k.GW, typed.Scope)
			sha256.Sum256(c.b)
			putCanon(c)
		}
	})
}
