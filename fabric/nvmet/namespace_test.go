package nvmet_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvmegate/nvmegate/cryptdev"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
)

// memCrypt keeps mappings as cryptsetup would: a name maps one device with
// one key until closed.
type memCrypt struct {
	open map[string]string // name -> device
	keys map[string][]byte
}

func (c *memCrypt) Open(name, device string, key []byte) (string, error) {
	if c.open == nil {
		c.open, c.keys = map[string]string{}, map[string][]byte{}
	}
	if _, ok := c.open[name]; !ok {
		c.open[name], c.keys[name] = device, bytes.Clone(key)
	}
	return "/dev/mapper/" + name, nil
}

func (c *memCrypt) Close(name string) error { delete(c.open, name); delete(c.keys, name); return nil }

func (c *memCrypt) List() ([]string, error) {
	var out []string
	for n := range c.open {
		out = append(out, n)
	}
	return out, nil
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A namespace with a backing device is exported through a dm-crypt
// mapping keyed with its data key; the operator's namespaces are left
// alone; a namespace that leaves the state is disabled, removed and its
// mapping closed.
func TestEncryptedNamespaces(t *testing.T) {
	const sub = "nqn.2026-01.io.example:enc"
	root := t.TempDir()
	c := &memCrypt{}
	d := &nvmet.Driver{Root: root, Crypt: c}
	key := bytes.Repeat([]byte{7}, 32)
	state := func(nss ...fabric.Namespace) fabric.State {
		return fabric.State{Generation: 1, Subsystems: []fabric.Subsystem{{NQN: sub, Namespaces: nss,
			Ports: []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "127.0.0.1", Trsvcid: "4420", Treq: "not specified"}}}}}
	}
	// The operator's namespace 2, which the driver must not touch.
	op := filepath.Join(root, "subsystems", sub, "namespaces", "2")
	os.MkdirAll(op, 0o755)
	os.WriteFile(filepath.Join(op, "device_path"), []byte("/dev/nullb1\n"), 0o644)
	os.WriteFile(filepath.Join(op, "enable"), []byte("1\n"), 0o644)

	// configfs makes a namespace's attributes with its directory; a new
	// one's device_path reads "(null)".
	ns1 := filepath.Join(root, "subsystems", sub, "namespaces", "1")
	os.MkdirAll(ns1, 0o755)
	os.WriteFile(filepath.Join(ns1, "device_path"), []byte("(null)\n"), 0o644)
	if err := d.Apply(context.Background(), state(fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0", DataKey: key}, fabric.Namespace{NSID: 2})); err != nil {
		t.Fatal(err)
	}
	name := cryptdev.Name(sub + "/1")
	ns := filepath.Join(root, "subsystems", sub, "namespaces", "1")
	if c.open[name] != "/dev/loop0" || !bytes.Equal(c.keys[name], key) {
		t.Fatalf("mappings: %v", c.open)
	}
	if read(t, filepath.Join(ns, "device_path")) != "/dev/mapper/"+name || read(t, filepath.Join(ns, "enable")) != "1" {
		t.Fatalf("namespace 1: device_path %q enable %q", read(t, filepath.Join(ns, "device_path")), read(t, filepath.Join(ns, "enable")))
	}
	if read(t, filepath.Join(op, "device_path")) != "/dev/nullb1" {
		t.Fatal("the operator's namespace was changed")
	}

	// Namespace 1 leaves the state: removed, its mapping closed; 2 stays.
	if err := d.Apply(context.Background(), state(fabric.Namespace{NSID: 2})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ns); !os.IsNotExist(err) {
		t.Fatalf("namespace 1 left behind: %v", err)
	}
	if len(c.open) != 0 {
		t.Fatalf("mappings left open: %v", c.open)
	}
	if read(t, filepath.Join(op, "enable")) != "1" {
		t.Fatal("the operator's namespace was disabled")
	}

	// A backing device for the operator's NSID is refused, not taken over.
	err := d.Apply(context.Background(), state(fabric.Namespace{NSID: 2, BackingDevice: "/dev/loop1", DataKey: key}))
	if err == nil || !strings.Contains(err.Error(), "another device") {
		t.Fatalf("taking over the operator's namespace: %v", err)
	}
	// Without dm-crypt, no namespace is exported in the clear.
	plain := &nvmet.Driver{Root: t.TempDir()}
	err = plain.Apply(context.Background(), state(fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0", DataKey: key}))
	if err == nil || !strings.Contains(err.Error(), "no dm-crypt") {
		t.Fatalf("a namespace to encrypt on a target without dm-crypt: %v", err)
	}
	if _, err := os.Stat(filepath.Join(plain.Root, "subsystems", sub, "namespaces", "1")); !os.IsNotExist(err) {
		t.Fatal("the namespace was made without encryption")
	}
}

// failCrypt is dm-crypt whose cryptsetup refuses to open anything new
// (mappings already open stay), and, with stuck, to close anything.
type failCrypt struct {
	memCrypt
	stuck bool
}

func (c *failCrypt) Close(name string) error {
	if c.stuck {
		return errors.New("cryptsetup: device in use")
	}
	return c.memCrypt.Close(name)
}

func (c *failCrypt) Open(name, device string, key []byte) (string, error) {
	if _, ok := c.open[name]; ok {
		return "/dev/mapper/" + name, nil
	}
	return "", errors.New("cryptsetup: device busy")
}

// Issue 29, defect 5: a namespace the target cannot serve (here no
// cryptsetup at all) is reported, not exported, and holds back nothing
// else: another subsystem's host is added, hosts of either subsystem are
// removed, deltas are taken on top, and the next whole state tries the
// namespace again.
func TestNamespaceNotServedHoldsBackNothing(t *testing.T) {
	const bad, other = "nqn.2026-01.io.example:a-enc", "nqn.2026-01.io.example:b-plain"
	root := t.TempDir()
	d := &nvmet.Driver{Root: root} // no Crypt: an agent without cryptsetup
	ctx := context.Background()
	port := []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "127.0.0.1", Trsvcid: "4420", Treq: "not required", Tsas: "none"}}
	enc := fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0", DataKey: bytes.Repeat([]byte{7}, 32)}
	st := func(gen uint64, badHosts, otherHosts []fabric.Host) fabric.State {
		return fabric.State{Generation: gen, Subsystems: []fabric.Subsystem{
			{NQN: bad, Hosts: badHosts, Ports: port, Namespaces: []fabric.Namespace{enc}},
			{NQN: other, Hosts: otherHosts, Ports: port},
		}}
	}
	linked := func(s, h string) bool {
		_, err := os.Lstat(filepath.Join(root, "subsystems", s, "allowed_hosts", h))
		return err == nil
	}
	exists := func(p ...string) bool {
		_, err := os.Stat(filepath.Join(append([]string{root}, p...)...))
		return err == nil
	}
	a, b := host(hostA, keyA1, ""), host(hostB, keyB1, "")

	err := d.Apply(ctx, st(1, []fabric.Host{a}, []fabric.Host{b}))
	ns, partial := fabric.NotServedIn(err)
	if !partial || len(ns) != 1 || ns[0].Subsystem != bad || ns[0].NSID != 1 || !strings.Contains(ns[0].Reason, "no dm-crypt") {
		t.Fatalf("Apply: %v (want the namespace reported as not served)", err)
	}
	if strings.Contains(err.Error(), string(enc.DataKey)) {
		t.Fatal("the report carries the data key")
	}
	if !linked(bad, hostA) || !linked(other, hostB) || read(t, filepath.Join(root, "hosts", hostB, "dhchap_key")) != keyB1 {
		t.Fatal("the hosts of the state were not applied beside the namespace not served")
	}
	if exists("subsystems", bad, "namespaces", "1") {
		t.Fatal("the namespace was made without encryption")
	}
	// Deltas are taken on top of the partial state: a release on either
	// subsystem removes the host.
	if err := d.ApplyDelta(ctx, fabric.Delta{Base: 1, Generation: 2, Hosts: []fabric.HostChange{
		{Subsystem: other, Host: fabric.Host{NQN: hostB}, Remove: true},
		{Subsystem: bad, Host: fabric.Host{NQN: hostA}, Remove: true},
	}}); err != nil {
		t.Fatalf("a delta after a partial state: %v", err)
	}
	if linked(bad, hostA) || linked(other, hostB) || exists("hosts", hostA) || exists("hosts", hostB) {
		t.Fatal("released hosts are still on the target")
	}
	// The next whole state is applied again (not skipped as unchanged):
	// the namespace is tried again and reported again, and a host is added
	// to the other subsystem.
	err = d.Apply(ctx, st(3, nil, []fabric.Host{b}))
	if _, partial := fabric.NotServedIn(err); !partial || !linked(other, hostB) {
		t.Fatalf("the next whole state: %v", err)
	}
	if err := d.Apply(ctx, st(4, nil, []fabric.Host{b})); err == nil {
		t.Fatal("a state with a namespace not served was remembered as applied")
	}

	// Removals come first: a state that fails on a host it adds (here a
	// file where its entry goes) has removed the host it released.
	if err := os.WriteFile(filepath.Join(root, "hosts", hostA), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(ctx, st(5, []fabric.Host{a}, nil)); err == nil {
		t.Fatal("a host entry that cannot be written: no error")
	}
	if linked(other, hostB) || exists("hosts", hostB) {
		t.Fatal("a failed addition held back a removal")
	}
}

// A namespace cryptsetup refuses to open is taken down if it was exported
// (never left on a device not under its key), reported, and the others are
// exported; a held namespace (no data key: the key store is away) is kept
// as the target has it, and one not exported yet is not made.
func TestNamespaceOpenFailsAndHeld(t *testing.T) {
	const sub = "nqn.2026-01.io.example:enc"
	root := t.TempDir()
	c := &failCrypt{}
	d := &nvmet.Driver{Root: root, Crypt: &c.memCrypt}
	ctx := context.Background()
	key := bytes.Repeat([]byte{7}, 32)
	state := func(nss ...fabric.Namespace) fabric.State {
		return fabric.State{Generation: 1, Subsystems: []fabric.Subsystem{{NQN: sub, Namespaces: nss,
			Ports: []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "127.0.0.1", Trsvcid: "4420", Treq: "not specified"}}}}}
	}
	nsDir := func(id string) string { return filepath.Join(root, "subsystems", sub, "namespaces", id) }
	if err := d.Apply(ctx, state(fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0", DataKey: key},
		fabric.Namespace{NSID: 2, BackingDevice: "/dev/loop1", DataKey: key})); err != nil {
		t.Fatal(err)
	}
	// Held: 1 stays exported through its open mapping; 3 is not made.
	err := d.Apply(ctx, state(fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0"},
		fabric.Namespace{NSID: 2, BackingDevice: "/dev/loop1", DataKey: key},
		fabric.Namespace{NSID: 3, BackingDevice: "/dev/loop2"}))
	ns, partial := fabric.NotServedIn(err)
	if !partial || len(ns) != 1 || ns[0].NSID != 3 || !strings.Contains(ns[0].Reason, "key store") {
		t.Fatalf("held namespaces: %v", err)
	}
	if read(t, filepath.Join(nsDir("1"), "enable")) != "1" || c.open[cryptdev.Name(sub+"/1")] == "" {
		t.Fatal("a held namespace was taken down")
	}
	if _, err := os.Stat(nsDir("3")); !os.IsNotExist(err) {
		t.Fatal("a held namespace was made without its key")
	}
	// cryptsetup refuses: 2 (mapping closed meanwhile) is taken down and
	// reported; 1 is exported.
	d.Crypt = c
	c.Close(cryptdev.Name(sub + "/2"))
	err = d.Apply(ctx, state(fabric.Namespace{NSID: 1, BackingDevice: "/dev/loop0", DataKey: key},
		fabric.Namespace{NSID: 2, BackingDevice: "/dev/loop1", DataKey: key}))
	ns, partial = fabric.NotServedIn(err)
	if !partial || len(ns) != 1 || ns[0].NSID != 2 || !strings.Contains(ns[0].Reason, "device busy") {
		t.Fatalf("a namespace cryptsetup refuses: %v", err)
	}
	if _, err := os.Stat(nsDir("2")); !os.IsNotExist(err) {
		t.Fatal("a namespace whose mapping cannot be opened is still there")
	}
	if read(t, filepath.Join(nsDir("1"), "enable")) != "1" {
		t.Fatal("the namespace beside it is not exported")
	}
	// A namespace that leaves the state and cannot be taken down (its
	// mapping will not close) is reported as still exported: a removal
	// not done, which the agent does not count as applied.
	c.stuck = true
	err = d.Apply(ctx, state())
	ns, partial = fabric.NotServedIn(err)
	if !partial || len(ns) != 1 || ns[0].NSID != 1 || !ns[0].Exported {
		t.Fatalf("a namespace that cannot be taken down: %v", err)
	}
}
