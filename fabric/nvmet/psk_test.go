package nvmet_test

import (
	"bytes"
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// ring is an in-memory keyring with the kernel's semantics that matter
// here: one key per description, a second add replaces the payload. The
// real ".nvme" ring (keyring.NVMe) needs an NVMe TLS module loaded; the
// VM tier (e2e/vm_test.go, Linux 6.12) runs this driver against it.
type ring struct{ keys map[string][]byte }

func (r *ring) Set(desc string, payload []byte) (int, error) {
	r.keys[desc] = bytes.Clone(payload)
	return len(r.keys), nil
}
func (r *ring) Remove(desc string) error { delete(r.keys, desc); return nil }
func (r *ring) List() (map[string]int, error) {
	out := map[string]int{}
	for d := range r.keys {
		out[d] = 1
	}
	return out, nil
}

// Two configured PSKs (32 bytes, SHA-256) in the interchange format.
func testPSK(t *testing.T, fill byte) string {
	t.Helper()
	s, err := nvmefmt.EncodeTLSPSK(nvmefmt.SHA256, bytes.Repeat([]byte{fill}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantKeys is what the ring must hold for host h on subsystem s.
func wantKeys(t *testing.T, h fabric.Host, s string) map[string][]byte {
	t.Helper()
	k, err := nvmefmt.ParseTLSPSK(h.TLSPSK)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nvmefmt.DeriveTLS(k, h.NQN, s)
	if err != nil {
		t.Fatal(err)
	}
	compat, err := nvmefmt.DeriveTLS(k, h.NQN, s, nvmefmt.CompatLabels())
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{c.IdentityV0: c.PSKV0, c.IdentityV1: c.PSKV1, compat.IdentityV1: compat.PSKV1}
}

func tlsState(hosts ...fabric.Host) fabric.State {
	st := state(hosts...)
	st.Subsystems[0].Ports[0].Treq, st.Subsystems[0].Ports[0].Tsas = "required", "tls1.3"
	return st
}

// A TLS host gets its PSK under both identities a host may present, on
// the subsystem it is allowed on, with its DH-HMAC-CHAP key as before; a
// rotation replaces them, a removal takes them out, and keys of a
// subsystem the driver does not own stay.
func TestApplyInstallsPSKs(t *testing.T) {
	ctx := context.Background()
	r := &ring{keys: map[string][]byte{"NVMe0R01 " + hostB + " nqn.2026-01.io.other:sub": []byte("not ours")}}
	d := &nvmet.Driver{Root: t.TempDir(), Recheck: time.Hour, PSKs: r}
	a := host(hostA, keyA1, "")
	a.TLSPSK = testPSK(t, 1)
	if err := d.Apply(ctx, tlsState(a)); err != nil {
		t.Fatal(err)
	}
	want := wantKeys(t, a, sub)
	want["NVMe0R01 "+hostB+" nqn.2026-01.io.other:sub"] = []byte("not ours")
	if !maps.EqualFunc(r.keys, want, bytes.Equal) {
		t.Fatalf("ring after Apply: %v; want %v", slices.Sorted(maps.Keys(r.keys)), slices.Sorted(maps.Keys(want)))
	}
	tree := dump(t, d.Root)
	for _, line := range []string{`addr_tsas 0644 "tls1.3\n"`, `addr_treq 0644 "required\n"`, "hosts/" + hostA + "/dhchap_key"} {
		if !strings.Contains(tree, line) {
			t.Errorf("tree lacks %q:\n%s", line, tree)
		}
	}

	// A rotation: new PSK, new v1 identity (its digest changes), the old
	// one gone; the v0 identity keeps its name with the new payload.
	a2 := host(hostA, keyA2, "")
	a2.TLSPSK = testPSK(t, 2)
	if err := d.Apply(ctx, tlsState(a2)); err != nil {
		t.Fatal(err)
	}
	want = wantKeys(t, a2, sub)
	want["NVMe0R01 "+hostB+" nqn.2026-01.io.other:sub"] = []byte("not ours")
	if !maps.EqualFunc(r.keys, want, bytes.Equal) {
		t.Fatalf("ring after rotation: %v; want %v", slices.Sorted(maps.Keys(r.keys)), slices.Sorted(maps.Keys(want)))
	}

	if err := d.Apply(ctx, tlsState()); err != nil {
		t.Fatal(err)
	}
	if len(r.keys) != 1 || r.keys["NVMe0R01 "+hostB+" nqn.2026-01.io.other:sub"] == nil {
		t.Errorf("after the host left, the ring holds %v; want only the other subsystem's key", slices.Sorted(maps.Keys(r.keys)))
	}
}

// Deltas keep the ring as Apply would: a granted host's keys before the
// delta returns, the old identity's key gone at a re-key, all gone at a
// removal.
func TestApplyDeltaPSKs(t *testing.T) {
	ctx := context.Background()
	r := &ring{keys: map[string][]byte{}}
	d := &nvmet.Driver{Root: t.TempDir(), Recheck: time.Hour, PSKs: r}
	if err := d.Apply(ctx, tlsState()); err != nil {
		t.Fatal(err)
	}
	a := host(hostA, keyA1, "")
	a.TLSPSK = testPSK(t, 1)
	step := func(gen uint64, c fabric.HostChange, want map[string][]byte) {
		t.Helper()
		if err := d.ApplyDelta(ctx, fabric.Delta{Base: gen - 1, Generation: gen, Hosts: []fabric.HostChange{c}}); err != nil {
			t.Fatal(err)
		}
		if !maps.EqualFunc(r.keys, want, bytes.Equal) {
			t.Fatalf("generation %d: ring %v; want %v", gen, slices.Sorted(maps.Keys(r.keys)), slices.Sorted(maps.Keys(want)))
		}
	}
	step(1, fabric.HostChange{Subsystem: sub, Host: a}, wantKeys(t, a, sub))
	a2 := host(hostA, keyA2, "")
	a2.TLSPSK = testPSK(t, 2)
	step(2, fabric.HostChange{Subsystem: sub, Host: a2}, wantKeys(t, a2, sub))
	step(3, fabric.HostChange{Subsystem: sub, Host: fabric.Host{NQN: hostA}, Remove: true}, map[string][]byte{})
}

// Fail closed: a TLS host without DH-HMAC-CHAP is refused even with a
// keyring — nvmet does not tie the PSK to the host NQN the Connect names.
func TestTLSHostNeedsDHCHAP(t *testing.T) {
	d := &nvmet.Driver{Root: t.TempDir(), Recheck: time.Hour, PSKs: &ring{keys: map[string][]byte{}}}
	err := d.Apply(context.Background(), tlsState(fabric.Host{NQN: hostA, TLSPSK: testPSK(t, 1)}))
	if err == nil || !strings.Contains(err.Error(), "no DH-HMAC-CHAP key") {
		t.Errorf("Apply of a TLS-only host: %v; want refused for its missing DH-HMAC-CHAP key", err)
	}
}
