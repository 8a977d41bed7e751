package spdk_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/spdk"
)

const (
	sub   = "nqn.2026-01.io.nvmegate.test:spdk-sub"
	hostA = "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000"
	key1  = "DHHC-1:01:sKpQc1nGaocWSUWCMDyUIVzJZfcGvVxKRLWgNfWsdqy1YkTc:"
	key2  = "DHHC-1:01:F0kh4zhDTeUynyyQkPFw4ZXI/wgvzRTuL5g7kjhdubo81ukn:"
	ctrl  = "DHHC-1:01:shwO4h6qLEsjJTyTW+6OYTGb1v7oQGy2/L+VM2WL7ChYfxmc:"
	psk1  = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:"
	psk2  = "NVMeTLSkey-1:01:MDAxMTIyMzM0NDU1NjY3Nzg4OTlhYWJiY2NkZGVlZmZwJEiQ:"
)

func state(hosts ...fabric.Host) fabric.State {
	return fabric.State{Subsystems: []fabric.Subsystem{{NQN: sub, Hosts: hosts}}}
}

// The driver's calls, in order, over connect, rotation, PSK change,
// release; what the peer holds after each; key files 0600 and cleaned up.
func TestApply(t *testing.T) {
	p, sock := startPeer(t, sub)
	keyDir := t.TempDir()
	d := &spdk.Driver{Socket: sock, KeyDir: keyDir}
	ctx := context.Background()
	a := fabric.Host{NQN: hostA, DHCHAPKey: key1, DHCHAPCtrlKey: ctrl}
	b := fabric.Host{NQN: hostB, TLSPSK: psk1}

	if err := d.Apply(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	subs, kr, calls := p.snapshot()
	if len(subs[sub]) != 2 || len(kr) != 3 {
		t.Fatalf("after connect: hosts %v, keys %v", subs[sub], kr)
	}
	for name, path := range kr {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 || !strings.HasPrefix(name, spdk.KeyPrefix) {
			t.Fatalf("key %s at %s: %v %v", name, path, fi, err)
		}
	}
	if subs[sub][hostB]["psk"] == "" || subs[sub][hostB]["dhchap_key"] != "" || subs[sub][hostA]["dhchap_ctrlr_key"] == "" {
		t.Fatalf("host params %v", subs[sub])
	}
	if n := count(calls, "nvmf_subsystem_add_host"); n != 2 {
		t.Fatalf("calls %v", calls)
	}

	// QoS: set once, then only when it changes.
	qs := state(a, b)
	qs.Subsystems[0].Namespaces = []fabric.Namespace{{NSID: 1, MaxIOPS: 5000, MaxMBps: 200}}
	if err := d.Apply(ctx, qs); err != nil {
		t.Fatal(err)
	}
	if q := p.qosOf("Nvme0n1"); q != [2]float64{5000, 200} {
		t.Fatalf("qos %v", q)
	}
	p.snapshot()
	if err := d.Apply(ctx, qs); err != nil {
		t.Fatal(err)
	}
	if _, _, calls = p.snapshot(); slices.Contains(calls, "bdev_set_qos_limit") {
		t.Fatalf("qos set again unchanged: %v", calls)
	}
	// Idempotent: the same state changes nothing.
	if err := d.Apply(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	if _, _, calls = p.snapshot(); slices.ContainsFunc(calls, func(c string) bool { return c != "nvmf_get_subsystems" && c != "keyring_get_keys" }) {
		t.Fatalf("second apply called %v", calls)
	}

	// A's DH-HMAC-CHAP key rotates: re-keyed in place, the old key gone.
	a.DHCHAPKey = key2
	if err := d.Apply(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	_, kr, calls = p.snapshot()
	if !slices.Contains(calls, "nvmf_subsystem_set_keys") || slices.Contains(calls, "nvmf_subsystem_remove_host") || len(kr) != 3 {
		t.Fatalf("rotation: calls %v, keys %d", calls, len(kr))
	}

	// B's PSK changes: SPDK cannot change it in place — removed and added.
	b.TLSPSK = psk2
	if err := d.Apply(ctx, state(a, b)); err != nil {
		t.Fatal(err)
	}
	_, _, calls = p.snapshot()
	if i, j := slices.Index(calls, "nvmf_subsystem_remove_host"), slices.Index(calls, "nvmf_subsystem_add_host"); i < 0 || j < i {
		t.Fatalf("PSK change: %v", calls)
	}

	// A is released: removed, its keys unregistered and deleted.
	if err := d.Apply(ctx, state(b)); err != nil {
		t.Fatal(err)
	}
	subs, kr, _ = p.snapshot()
	if len(subs[sub]) != 1 || len(kr) != 1 {
		t.Fatalf("after release: hosts %v keys %v", subs[sub], kr)
	}
	files, _ := os.ReadDir(keyDir)
	if len(files) != 1 {
		t.Fatalf("key files left: %d", len(files))
	}
	// A restarted driver (nothing in memory) converges to the same state.
	d2 := &spdk.Driver{Socket: sock, KeyDir: keyDir}
	if err := d2.Apply(ctx, state(b)); err != nil {
		t.Fatal(err)
	}
	if subs, kr, _ = p.snapshot(); len(subs[sub]) != 1 || len(kr) != 1 {
		t.Fatalf("after restart: hosts %v keys %v", subs[sub], kr)
	}
}

func count(ss []string, s string) int {
	n := 0
	for _, x := range ss {
		if x == s {
			n++
		}
	}
	return n
}

// What SPDK cannot do is refused before anything is sent, and errors never
// carry a secret.
func TestApplyRefusals(t *testing.T) {
	p, sock := startPeer(t, sub)
	d := &spdk.Driver{Socket: sock, KeyDir: t.TempDir()}
	ctx := context.Background()
	err := d.Apply(ctx, state(fabric.Host{NQN: hostA, DHCHAPKey: key1, TLSPSK: psk1}))
	if err == nil || !strings.Contains(err.Error(), "does not combine in-band authentication") || strings.Contains(err.Error(), "DHHC-1") {
		t.Fatalf("dhchap + psk: %v", err)
	}
	err = d.Apply(ctx, fabric.State{Subsystems: []fabric.Subsystem{{NQN: sub + "-absent"}}})
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("absent subsystem: %v", err)
	}
	if err := (&spdk.Driver{Socket: sock, KeyDir: "relative"}).Apply(ctx, state()); err == nil {
		t.Fatal("relative key dir accepted")
	}
	// A namespace to encrypt at rest is reported, not served in the clear
	// by nvmegate, and holds back nothing else (issue 29, defect 5): the
	// state's host is added, and the next state's removal taken.
	enc := state(fabric.Host{NQN: hostA, DHCHAPKey: key1})
	enc.Subsystems[0].Namespaces = []fabric.Namespace{{NSID: 1, BackingDevice: "/dev/nvme0n1", DataKey: make([]byte, 32)}}
	err = d.Apply(ctx, enc)
	if ns, partial := fabric.NotServedIn(err); !partial || len(ns) != 1 || ns[0].NSID != 1 || !strings.Contains(err.Error(), "encrypted at rest") {
		t.Fatalf("a namespace to encrypt: %v", err)
	}
	if subs, _, _ := p.snapshot(); len(subs[sub]) != 1 {
		t.Fatalf("hosts beside a namespace not served: %v", subs[sub])
	}
	if err := d.ApplyDelta(ctx, fabric.Delta{Hosts: []fabric.HostChange{{Subsystem: sub, Host: fabric.Host{NQN: hostA}, Remove: true}}}); err != nil {
		t.Fatalf("a delta on top of a partial state: %v", err)
	}
	if subs, _, _ := p.snapshot(); len(subs[sub]) != 0 {
		t.Fatalf("a released host is still on the target: %v", subs[sub])
	}
	if err := (&spdk.Driver{Socket: sock + ".none", KeyDir: t.TempDir()}).Apply(ctx, state()); err == nil {
		t.Fatal("no socket: no error")
	}
}
