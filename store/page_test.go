package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate"
)

// TestPagination lists 250 records of each kind in pages of 100: three
// pages (100, 100, 50), the last without a token, every record once, in key
// order.
func TestPagination(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	const n = 250
	must(t, db.CreateTarget(ctx, newTarget("t0")))
	must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(0), "t0", "acme")))
	for i := 1; i < n; i++ {
		must(t, db.CreateTarget(ctx, newTarget(fmt.Sprintf("t%d", i))))
		must(t, db.CreateSubsystem(ctx, newSubsystem(subNQN(i), "t0", "acme")))
	}
	for i := range n {
		must(t, db.CreateNamespace(ctx, newNamespace(subNQN(i%7), uint32(1+i), "acme")))
		must(t, db.CreateHostBinding(ctx, newBinding(i, "")))
	}

	t.Run("targets", func(t *testing.T) {
		checkPages(t, func(p Page) ([]string, string, error) {
			items, next, err := db.ListTargets(ctx, TargetFilter{}, p)
			return keysOf(items, func(x *nvmegate.Target) string { return x.ID }), next, err
		}, n)
	})
	t.Run("subsystems", func(t *testing.T) {
		checkPages(t, func(p Page) ([]string, string, error) {
			items, next, err := db.ListSubsystems(ctx, SubsystemFilter{}, p)
			return keysOf(items, func(x *nvmegate.Subsystem) string { return x.NQN }), next, err
		}, n)
	})
	t.Run("subsystems by target", func(t *testing.T) {
		checkPages(t, func(p Page) ([]string, string, error) {
			items, next, err := db.ListSubsystems(ctx, SubsystemFilter{TargetID: "t0"}, p)
			return keysOf(items, func(x *nvmegate.Subsystem) string { return x.NQN }), next, err
		}, n)
	})
	t.Run("namespaces", func(t *testing.T) {
		checkPages(t, func(p Page) ([]string, string, error) {
			items, next, err := db.ListNamespaces(ctx, NamespaceFilter{}, p)
			return keysOf(items, func(x *nvmegate.Namespace) string { return string(namespaceKey(x.SubsystemNQN, x.NSID)) }), next, err
		}, n)
	})
	t.Run("host bindings", func(t *testing.T) {
		checkPages(t, func(p Page) ([]string, string, error) {
			items, next, err := db.ListHostBindings(ctx, HostBindingFilter{}, p)
			return keysOf(items, func(x *nvmegate.HostBinding) string { return x.SPIFFEID }), next, err
		}, n)
	})
	t.Run("default and max size", func(t *testing.T) {
		for _, size := range []int{0, MaxPageSize + 1, 1 << 40} {
			items, _, err := db.ListTargets(ctx, TargetFilter{}, Page{Size: size})
			must(t, err)
			want := min(n, DefaultPageSize)
			if size != 0 {
				want = min(n, MaxPageSize)
			}
			if len(items) != want {
				t.Errorf("size %d: %d items, want %d", size, len(items), want)
			}
		}
		if got, _, _ := (Page{Size: 1 << 40}).parse(kindTargets); got != MaxPageSize {
			t.Errorf("size 1<<40 parses to %d, want %d", got, MaxPageSize)
		}
		_, _, err := db.ListTargets(ctx, TargetFilter{}, Page{Size: -1})
		wantError(t, err, nvmegate.EINVALID, "page_size")
	})
}

func keysOf[T any](items []T, key func(T) string) []string {
	keys := make([]string, len(items))
	for i, x := range items {
		keys[i] = key(x)
	}
	return keys
}

// checkPages lists with page size 100 and checks there are exactly three
// pages with all n keys once, ascending.
func checkPages(t *testing.T, list func(Page) ([]string, string, error), n int) {
	t.Helper()
	var all []string
	token := ""
	var sizes []int
	for range 10 {
		keys, next, err := list(Page{Size: 100, Token: token})
		must(t, err)
		sizes = append(sizes, len(keys))
		all = append(all, keys...)
		if next == "" {
			break
		}
		token = next
	}
	if fmt.Sprint(sizes) != "[100 100 50]" {
		t.Errorf("page sizes %v, want [100 100 50]", sizes)
	}
	if len(all) != n {
		t.Errorf("%d records listed, want %d", len(all), n)
	}
	seen := map[string]bool{}
	for i, k := range all {
		if seen[k] {
			t.Errorf("record %q listed twice", k)
		}
		seen[k] = true
		if i > 0 && all[i-1] >= k {
			t.Errorf("out of order: %q after %q", k, all[i-1])
		}
	}
}

// TestPaginationStableUnderInserts inserts records before and after the
// position of a listing between two pages: every record present throughout
// is listed exactly once, in order.
func TestPaginationStableUnderInserts(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	noSync(db)
	id := func(i int) string { return fmt.Sprintf("t%03d", i) }
	original := map[string]bool{}
	for i := 0; i < 300; i += 10 {
		must(t, db.CreateTarget(ctx, newTarget(id(i))))
		original[id(i)] = true
	}
	var listed []string
	token := ""
	for page := 0; ; page++ {
		items, next, err := db.ListTargets(ctx, TargetFilter{}, Page{Size: 7, Token: token})
		must(t, err)
		for _, tg := range items {
			listed = append(listed, tg.ID)
		}
		if next == "" {
			break
		}
		token = next
		// Insert one record just before and one just after the cursor, and
		// one far ahead; delete one far ahead that is not original.
		last := items[len(items)-1].ID
		var at int
		fmt.Sscanf(last, "t%d", &at)
		for _, j := range []int{at - 1, at + 1, at + 5 + page} {
			if j >= 0 && j < 1000 && !original[id(j)] {
				err := db.CreateTarget(ctx, newTarget(id(j)))
				if err != nil && nvmegate.ErrorCode(err) != nvmegate.EEXISTS {
					t.Fatal(err)
				}
			}
		}
	}
	seen := map[string]bool{}
	for i, k := range listed {
		if seen[k] {
			t.Errorf("%s listed twice", k)
		}
		seen[k] = true
		if i > 0 && listed[i-1] >= k {
			t.Errorf("out of order: %s after %s", k, listed[i-1])
		}
	}
	for k := range original {
		if !seen[k] {
			t.Errorf("%s never listed", k)
		}
	}
}

func TestMalformedPageToken(t *testing.T) {
	ctx := context.Background()
	db := openTestDB(t)
	inventory(t, db, "acme")
	must(t, db.CreateTarget(ctx, newTarget("t2")))
	must(t, db.CreateTarget(ctx, newTarget("t3")))
	_, targetToken, err := db.ListTargets(ctx, TargetFilter{}, Page{Size: 1})
	must(t, err)
	if targetToken == "" {
		t.Fatal("no token")
	}
	// The token works for its own listing.
	if _, _, err := db.ListTargets(ctx, TargetFilter{}, Page{Token: targetToken}); err != nil {
		t.Fatal(err)
	}

	bad := map[string]string{
		"not base64":         "!!!",
		"padded":             targetToken + "=",
		"with newline":       targetToken[:2] + "\n" + targetToken[2:],
		"truncated":          targetToken[:len(targetToken)-1],
		"empty key":          tokenEncoding.EncodeToString([]byte{tokenVersion, kindTargets}),
		"unknown version":    tokenEncoding.EncodeToString([]byte{9, kindTargets, 't'}),
		"too long":           strings.Repeat("A", 10000),
		"other listing":      encodeToken(kindSubsystems, []byte("t1")),
		"bad namespace key":  encodeToken(kindNamespaces, []byte("nqn.x")),
		"standard alphabet":  strings.NewReplacer("-", "+", "_", "/").Replace(encodeToken(kindTargets, []byte{0xfb, 0xff, 0xfe})),
		"non-zero pad bits":  flipLastBit(encodeToken(kindTargets, []byte("t1"))),
		"only a version tag": tokenEncoding.EncodeToString([]byte{tokenVersion}),
	}
	for name, token := range bad {
		_, _, err := db.ListTargets(ctx, TargetFilter{}, Page{Token: token})
		if nvmegate.ErrorCode(err) != nvmegate.EINVALID {
			t.Errorf("%s: token %q: error %v, want EINVALID", name, token, err)
			continue
		}
		wantError(t, err, nvmegate.EINVALID, "page_token")
	}
	// A namespace token must hold a namespace key.
	_, _, err = db.ListNamespaces(ctx, NamespaceFilter{}, Page{Token: bad["bad namespace key"]})
	wantError(t, err, nvmegate.EINVALID, "page_token")
	// A target token is refused by every other listing.
	_, _, err = db.ListNamespaces(ctx, NamespaceFilter{}, Page{Token: targetToken})
	wantError(t, err, nvmegate.EINVALID, "page_token")
	for _, list := range []func(Page) error{
		func(p Page) error { _, _, err := db.ListSubsystems(ctx, SubsystemFilter{}, p); return err },
		func(p Page) error {
			_, _, err := db.ListSubsystems(ctx, SubsystemFilter{TargetID: "t1"}, p)
			return err
		},
		func(p Page) error { _, _, err := db.ListHostBindings(ctx, HostBindingFilter{}, p); return err },
	} {
		wantError(t, list(Page{Token: targetToken}), nvmegate.EINVALID, "page_token")
	}
}

// flipLastBit changes the unused low bits of the last base64 character
// (len%3 == 1 leaves 4 such bits), which a lax decoder ignores.
func flipLastBit(s string) string {
	b := []byte(s)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, b[len(b)-1])
	b[len(b)-1] = alphabet[i|1]
	return string(b)
}

// FuzzPageToken feeds arbitrary strings to the token decoder of every
// listing: it must never panic, must accept only canonical tokens (a decoded
// token re-encodes to itself), and must round-trip what it encodes.
func FuzzPageToken(f *testing.F) {
	f.Add("")
	f.Add("!!!")
	f.Add(encodeToken(kindTargets, []byte("t1")))
	f.Add(encodeToken(kindNamespaces, namespaceKey(subNQN(1), 7)))
	f.Add(encodeToken(kindHostBindings, []byte(nodeID(1))))
	f.Add(encodeToken(kindSubsystems, []byte(subNQN(3))) + "\r\n")
	f.Fuzz(func(t *testing.T, token string) {
		for _, kind := range []byte{kindTargets, kindSubsystems, kindNamespaces, kindHostBindings} {
			key, err := decodeToken(kind, token)
			if err != nil {
				if nvmegate.ErrorCode(err) != nvmegate.EINVALID {
					t.Fatalf("decode %q: %v is not EINVALID", token, err)
				}
				continue
			}
			if token == "" {
				if key != nil {
					t.Fatalf("empty token decodes to %q", key)
				}
				continue
			}
			if got := encodeToken(kind, key); got != token {
				t.Fatalf("token %q decodes to %q which encodes to %q", token, key, got)
			}
		}
		// The input as a key round-trips through every kind that accepts it.
		key := []byte(token)
		if len(key) == 0 || len(key) > maxTokenKey {
			return
		}
		for _, kind := range []byte{kindTargets, kindSubsystems, kindHostBindings} {
			got, err := decodeToken(kind, encodeToken(kind, key))
			if err != nil || !bytes.Equal(got, key) {
				t.Fatalf("key %q: round trip gave %q, %v", key, got, err)
			}
		}
	})
}

// All follows page tokens to the end, asking for full pages, and stops at
// the first error.
func TestAll(t *testing.T) {
	pages := map[string]struct {
		items []int
		next  string
	}{"": {[]int{1, 2}, "a"}, "a": {[]int{3}, "b"}, "b": {nil, ""}}
	var sizes []int
	got, err := All(func(p Page) ([]int, string, error) {
		sizes = append(sizes, p.Size)
		pg := pages[p.Token]
		return pg.items, pg.next, nil
	})
	if err != nil || len(got) != 3 || got[2] != 3 || len(sizes) != 3 || sizes[0] != MaxPageSize {
		t.Fatalf("All = %v, %v (sizes %v)", got, err, sizes)
	}
	boom := errors.New("boom")
	if _, err := All(func(p Page) ([]int, string, error) { return []int{1}, "x", boom }); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
}
