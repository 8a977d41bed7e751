package nvmet_test

import (
	"bytes"
	"context"
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
