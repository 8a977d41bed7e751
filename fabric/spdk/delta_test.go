package spdk_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/spdk"
)

// Property: a whole state followed by random deltas (hosts added with
// DH-HMAC-CHAP keys, with a controller key, or with a PSK; re-keyed; moved
// from DH-HMAC-CHAP to a PSK and back; removed) leaves the target holding
// what a whole Apply of the resulting state gives a fresh one — the same
// hosts with the same keyring names, no other key of ours registered, no
// stray key file — and each delta calls only its hosts' RPCs.
func TestApplyDeltaEquivalence(t *testing.T) {
	subs := []string{sub, sub + "-2"}
	hosts := []string{hostA, hostB, "nqn.2014-08.org.example:host[1]*"}
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			ctx := context.Background()
			p, sock := startPeer(t, subs...)
			keyDir := t.TempDir()
			d := &spdk.Driver{Socket: sock, KeyDir: keyDir}
			st := fabric.State{Generation: 1, Subsystems: []fabric.Subsystem{{NQN: subs[0]}, {NQN: subs[1]}}}
			if err := d.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
			for step := range 40 {
				dl := fabric.Delta{Base: st.Generation, Generation: st.Generation + 1}
				for range 1 + rng.IntN(3) {
					c := fabric.HostChange{Subsystem: subs[rng.IntN(len(subs))], Host: fabric.Host{NQN: hosts[rng.IntN(len(hosts))]}}
					switch rng.IntN(4) {
					case 0:
						c.Remove = true
					case 1:
						c.Host.TLSPSK = fmt.Sprintf("NVMeTLSkey-1:01:psk-%d:", rng.IntN(4))
					default:
						c.Host.DHCHAPKey = fmt.Sprintf("DHHC-1:01:key-%d:", rng.IntN(4))
						if rng.IntN(2) == 0 {
							c.Host.DHCHAPCtrlKey = fmt.Sprintf("DHHC-1:01:ctrl-%d:", rng.IntN(4))
						}
					}
					dl.Hosts = append(dl.Hosts, c)
				}
				if err := st.ApplyDelta(dl); err != nil {
					t.Fatal(err)
				}
				p.snapshot()
				if err := d.ApplyDelta(ctx, dl); err != nil {
					t.Fatalf("step %d: %v (%v)", step, err, dl.Hosts)
				}
				got, gotKeys, calls := p.snapshot()
				if i := slices.IndexFunc(calls, func(c string) bool {
					return strings.HasSuffix(c, "_get_subsystems") || strings.HasSuffix(c, "_get_keys")
				}); i >= 0 {
					t.Fatalf("step %d: a delta listed the target: %v", step, calls)
				}
				want, wantKeys := wholeApply(t, subs, st)
				if !reflect.DeepEqual(got, want) || !slices.Equal(slices.Sorted(maps.Keys(gotKeys)), wantKeys) {
					t.Fatalf("step %d (%v): after deltas\n%v\n%v\nwhole\n%v\n%v", step, dl.Hosts, got, slices.Sorted(maps.Keys(gotKeys)), want, wantKeys)
				}
				files, _ := os.ReadDir(keyDir)
				if len(files) != len(gotKeys) {
					t.Fatalf("step %d: %d key files for %d keys", step, len(files), len(gotKeys))
				}
			}
		})
	}
}

// wholeApply is what a fresh target holds after a whole Apply of st.
func wholeApply(t *testing.T, subs []string, st fabric.State) (map[string]map[string]map[string]string, []string) {
	t.Helper()
	p, sock := startPeer(t, subs...)
	if err := (&spdk.Driver{Socket: sock, KeyDir: t.TempDir()}).Apply(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	hosts, keys, _ := p.snapshot()
	return hosts, slices.Sorted(maps.Keys(keys))
}

// What a delta cannot be applied to is refused before any call: no whole
// state yet, a subsystem the applied state does not have (both
// ErrNeedFull), DH-HMAC-CHAP with a PSK. No error names a secret.
func TestApplyDeltaRefusals(t *testing.T) {
	p, sock := startPeer(t, sub)
	d := &spdk.Driver{Socket: sock, KeyDir: t.TempDir()}
	ctx := context.Background()
	add := func(s string, h fabric.Host) fabric.Delta {
		return fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: s, Host: h}}}
	}
	if err := d.ApplyDelta(ctx, add(sub, fabric.Host{NQN: hostA, DHCHAPKey: key1})); !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("before a whole state: %v", err)
	}
	if err := d.Apply(ctx, state()); err != nil {
		t.Fatal(err)
	}
	p.snapshot()
	if err := d.ApplyDelta(ctx, add(sub+"-2", fabric.Host{NQN: hostA, DHCHAPKey: key1})); !errors.Is(err, fabric.ErrNeedFull) {
		t.Fatalf("unknown subsystem: %v", err)
	}
	err := d.ApplyDelta(ctx, add(sub, fabric.Host{NQN: hostA, DHCHAPKey: key1, TLSPSK: psk1}))
	if err == nil || !strings.Contains(err.Error(), "does not combine") || strings.Contains(err.Error(), "DHHC-1") || strings.Contains(err.Error(), "NVMeTLSkey") {
		t.Fatalf("dhchap + psk: %v", err)
	}
	if _, _, calls := p.snapshot(); len(calls) != 0 {
		t.Fatalf("refused deltas called %v", calls)
	}
	// A re-key is one key added, one set_keys, the old key removed.
	if err := d.ApplyDelta(ctx, add(sub, fabric.Host{NQN: hostA, DHCHAPKey: key1})); err != nil {
		t.Fatal(err)
	}
	p.snapshot()
	if err := d.ApplyDelta(ctx, add(sub, fabric.Host{NQN: hostA, DHCHAPKey: key2})); err != nil {
		t.Fatal(err)
	}
	if _, _, calls := p.snapshot(); !slices.Equal(calls, []string{"keyring_file_add_key", "nvmf_subsystem_set_keys", "keyring_file_remove_key"}) {
		t.Fatalf("re-key calls %v", calls)
	}
}
