package keyring

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testRing makes a keyring of the test's own in the process keyring, for
// keys of type "user": the "psk" type exists only once an NVMe TLS module
// is loaded, which the VM tiers do (e2e/vm_test.go) and this machine need
// not.
func testRing(t *testing.T) *Ring {
	t.Helper()
	id, err := unix.AddKey("keyring", "nvmegate-test-"+t.Name(), nil, unix.KEY_SPEC_PROCESS_KEYRING)
	if err != nil {
		t.Skipf("kernel keyrings unavailable here: %v", err)
	}
	t.Cleanup(func() { _, _ = unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0) })
	return &Ring{id: id, name: t.Name(), keyType: "user"}
}

func TestSetReplacesInPlaceAndRemove(t *testing.T) {
	r := testRing(t)
	const desc = "NVMe0R01 nqn.2014-08.org.nvmexpress:uuid:1 nqn.2026-01.io.example:s1"
	id1, err := r.Set(desc, []byte("first-payload-32-bytes-long-----"))
	if err != nil {
		t.Fatal(err)
	}
	id2, err := r.Set(desc, []byte("second-payload-32-bytes-long----"))
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 {
		t.Errorf("a second Set made key %d beside %d; want the payload replaced in place", id2, id1)
	}
	got := make([]byte, 64)
	n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, id2, got, 0)
	if err != nil || string(got[:n]) != "second-payload-32-bytes-long----" {
		t.Errorf("payload after replace: %q, %v", got[:n], err)
	}
	if _, err := r.Set("other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	keys, err := r.List()
	if err != nil || len(keys) != 2 || keys[desc] != id1 {
		t.Fatalf("List = %v, %v; want both keys", keys, err)
	}
	if err := r.Remove(desc); err != nil {
		t.Fatal(err)
	}
	if id, err := r.Lookup(desc); err != nil || id != 0 {
		t.Errorf("after Remove, Lookup = %d, %v; want 0", id, err)
	}
	if _, err := unix.KeyctlSearch(r.id, "user", desc, 0); err == nil {
		t.Errorf("a search of the ring still finds the removed key")
	}
	if err := r.Remove(desc); err != nil {
		t.Errorf("removing a key that is not there: %v", err)
	}
	// A description that is a prefix of a key's is another key.
	if id, err := r.Lookup("oth"); err != nil || id != 0 {
		t.Errorf("Lookup of a prefix of a key's description = %d, %v; want 0", id, err)
	}
	if _, err := r.Set("", []byte("x")); err == nil {
		t.Errorf("Set with an empty description succeeded")
	}
}

func TestFindInProcKeys(t *testing.T) {
	const listing = `0ab75fc6 I--Q---     1 perm 1f3f0000     0 65534 keyring   _uid_ses.0: 1
37e718c6 I------     1 perm 1f1f0000     0     0 keyring   .nvme: empty
0e0a3de1 I------     2 perm 000d0000     0     0 user      .nvme: 255
`
	id, err := findInProcKeys(strings.NewReader(listing), ".nvme")
	if err != nil || id != 0x37e718c6 {
		t.Errorf("findInProcKeys = %x, %v; want 37e718c6", id, err)
	}
	if _, err := findInProcKeys(strings.NewReader(listing), ".missing"); !errors.Is(err, ErrNoRing) {
		t.Errorf("a missing ring: %v; want ErrNoRing", err)
	}
}

func TestNamedRefusesTheKernelRing(t *testing.T) {
	if _, err := Named(NVMeRing); err == nil {
		t.Errorf("Named(.nvme) succeeded; the kernel's ring is not ours to make")
	}
}
