package nvmet_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
)

// Property: a whole state followed by random deltas (hosts added, re-keyed,
// given or stripped of a controller key, moved between subsystems,
// removed; NQNs with glob characters among them) leaves the tree a whole
// Apply of the resulting state makes on an empty one; and a driver that
// reads everything back finds nothing to change in it.
func TestApplyDeltaEquivalence(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			ctx := context.Background()
			subs := []string{sub, sub + "-2", sub + "-3"}
			nqns := []string{hostA, hostB, "nqn.2014-08.org.example:host[1]*", "nqn.2014-08.org.example:host[1]x", "nqn.2014-08.org.example:h?"}
			st := fabric.State{Generation: 1}
			for _, s := range subs {
				st.Subsystems = append(st.Subsystems, fabric.Subsystem{NQN: s,
					Ports: []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "127.0.0.1", Trsvcid: "4420", Treq: "not required", Tsas: "none"}}})
			}
			root, scratch := filepath.Join(t.TempDir(), "nvmet"), t.TempDir()
			d := &nvmet.Driver{Root: root, Recheck: time.Hour}
			if err := d.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			creds := map[string]fabric.Host{} // a host's credentials: the same on every subsystem
			allowed := func(h, s string) bool {
				i := slices.IndexFunc(st.Subsystems, func(x fabric.Subsystem) bool { return x.NQN == s })
				return slices.ContainsFunc(st.Subsystems[i].Hosts, func(x fabric.Host) bool { return x.NQN == h })
			}
			for step := range 25 {
				dl := fabric.Delta{Base: st.Generation, Generation: st.Generation + 1}
				add := func(c fabric.HostChange) { // to the delta, and to the state as it goes
					dl.Hosts = append(dl.Hosts, c)
					if err := st.ApplyDelta(fabric.Delta{Base: st.Generation, Generation: st.Generation, Hosts: []fabric.HostChange{c}}); err != nil {
						t.Fatal(err)
					}
				}
				for range 1 + rng.IntN(3) {
					h := nqns[rng.IntN(len(nqns))]
					s := subs[rng.IntN(len(subs))]
					switch op := rng.IntN(4); {
					case op == 0 && allowed(h, s):
						add(fabric.HostChange{Subsystem: s, Host: fabric.Host{NQN: h}, Remove: true})
					case op == 1 && creds[h].NQN != "":
						// Allowed on one more subsystem, same credentials.
						add(fabric.HostChange{Subsystem: s, Host: creds[h]})
					default:
						// New credentials, on every subsystem allowing it.
						n := fabric.Host{NQN: h, DHCHAPKey: fmt.Sprintf("DHHC-1:01:key-%d-%d:", step, rng.IntN(1000)),
							DHCHAPHash: fabric.Hash([]string{"sha256", "sha384"}[rng.IntN(2)]), DHCHAPGroup: "ffdhe2048"}
						if rng.IntN(2) == 0 {
							n.DHCHAPCtrlKey = fmt.Sprintf("DHHC-1:01:ctrl-%d:", step)
						}
						creds[h] = n
						others := slices.DeleteFunc(slices.Clone(subs), func(o string) bool { return o == s || !allowed(h, o) })
						add(fabric.HostChange{Subsystem: s, Host: n})
						for _, o := range others {
							add(fabric.HostChange{Subsystem: o, Host: n})
						}
					}
				}
				st.Generation = dl.Generation
				if err := d.ApplyDelta(ctx, dl); err != nil {
					t.Fatalf("step %d: %v (%v)", step, err, dl.Hosts)
				}
				want := filepath.Join(scratch, "nvmet")
				if err := os.RemoveAll(want); err != nil {
					t.Fatal(err)
				}
				if err := (&nvmet.Driver{Root: want}).Apply(ctx, st); err != nil {
					t.Fatal(err)
				}
				if got, want := dump(t, root), dump(t, want); got != want {
					t.Fatalf("step %d (%v): the tree after deltas differs from a whole Apply:\n--- deltas\n%s--- whole\n%s", step, dl.Hosts, got, want)
				}
			}
			tree := dump(t, root)
			if err := (&nvmet.Driver{Root: root, Recheck: -1}).Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			if dump(t, root) != tree {
				t.Fatal("a whole Apply over the deltas' tree changed it")
			}
		})
	}
}

// What a delta cannot be applied to is refused before anything is written:
// no whole state yet, a subsystem the applied state does not have (both
// ErrNeedFull: the caller sends the whole state), a host left with two
// sets of credentials, a host without a DH-HMAC-CHAP key. No error names a
// secret.
func TestApplyDeltaRefusals(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d := &nvmet.Driver{Root: root}
	add := func(s string, h fabric.Host) fabric.Delta {
		return fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: s, Host: h}}}
	}
	if err := d.ApplyDelta(ctx, add(sub, host(hostA, keyA1, ""))); !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("before a whole state: %v", err)
	}
	two := state(host(hostA, keyA1, ""))
	two.Subsystems = append(two.Subsystems, fabric.Subsystem{NQN: sub + "-2", Hosts: []fabric.Host{host(hostA, keyA1, "")}})
	if err := d.Apply(ctx, two); err != nil {
		t.Fatal(err)
	}
	tree := dump(t, root)
	for name, tc := range map[string]struct {
		d    fabric.Delta
		want string
	}{
		"unknown subsystem": {add(sub+"-3", host(hostB, keyB1, "")), "not in the applied state"},
		"two credentials":   {add(sub, host(hostA, keyA2, "")), "different credentials"},
		"no key":            {add(sub, fabric.Host{NQN: hostB}), "no DH-HMAC-CHAP key"},
		"a psk":             {add(sub, fabric.Host{NQN: hostB, DHCHAPKey: keyB1, TLSPSK: "NVMeTLSkey-1:01:x:"}), "no keyring"},
	} {
		err := d.ApplyDelta(ctx, tc.d)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "DHHC-1") || strings.Contains(err.Error(), "NVMeTLSkey") {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
		if name == "unknown subsystem" && !errors.Is(err, fabric.ErrNeedFull) {
			t.Errorf("%s: %v, want ErrNeedFull", name, err)
		}
		if dump(t, root) != tree {
			t.Fatalf("%s: a refused delta changed the tree", name)
		}
	}
	// Re-keyed on both subsystems at once: accepted.
	both := add(sub, host(hostA, keyA2, ""))
	both.Hosts = append(both.Hosts, fabric.HostChange{Subsystem: sub + "-2", Host: host(hostA, keyA2, "")})
	if err := d.ApplyDelta(ctx, both); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "hosts", hostA, "dhchap_key")); string(got) != keyA2+"\n" {
		t.Fatalf("key %q", got)
	}
}

// A delta reads and writes only the hosts it names (an edit behind the
// driver's back on another host stays until a whole state is applied), and
// after a failed application only a whole state is accepted.
func TestApplyDeltaTouchesOnlyItsHosts(t *testing.T) {
	ctx := context.Background()
	root := filepath.Join(t.TempDir(), "nvmet")
	d := &nvmet.Driver{Root: root, Recheck: -1}
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""))); err != nil {
		t.Fatal(err)
	}
	hashA := filepath.Join(root, "hosts", hostA, "dhchap_hash")
	if err := os.WriteFile(hashA, []byte("hmac(sha512)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.ApplyDelta(ctx, fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: sub, Host: host(hostB, keyB1, ctrl1)}}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(hashA); string(got) != "hmac(sha512)\n" {
		t.Fatalf("a delta for B read back A: %q", got)
	}
	if _, err := os.Readlink(filepath.Join(root, "subsystems", sub, "allowed_hosts", hostB)); err != nil {
		t.Fatalf("B not allowed: %v", err)
	}
	// The tree goes wrong under the driver: the next delta fails, and
	// then only a whole state is taken.
	if err := os.RemoveAll(filepath.Join(root, "subsystems", sub)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "subsystems", sub), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.ApplyDelta(ctx, fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: sub, Host: host(hostB, keyB1, "")}}}); err == nil || errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("a delta on a broken tree: %v", err)
	}
	if err := d.ApplyDelta(ctx, fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: sub, Host: host(hostA, keyA2, "")}}}); !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("a delta after a failed one: %v", err)
	}
	os.Remove(filepath.Join(root, "subsystems", sub))
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyB1, ""))); err != nil {
		t.Fatal(err)
	}
	if err := d.ApplyDelta(ctx, fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: sub, Host: fabric.Host{NQN: hostA}, Remove: true}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hosts", hostA)); !os.IsNotExist(err) {
		t.Fatalf("a host no subsystem allows was kept: %v", err)
	}
}
