package nodeagent

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	"github.com/nvmegate/nvmegate/nvmehost"
)

// pathKernel is a multipath host as sysfs shows it: a new controller's
// namespaces appear only after some reads (the kernel's scan runs after
// the connect returns), or never.
type pathKernel struct {
	mu        sync.Mutex
	next      int
	ns        map[string][]string // controller -> namespace IDs now
	scanAfter int                 // Namespaces calls before a new controller's scan lands; -1 never
	pending   map[string]int
	deleted   []string
}

func (k *pathKernel) Connect(string) (nvmehost.Controller, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.next++
	name := fmt.Sprintf("nvme%d", k.next)
	k.ns[name] = nil
	k.pending[name] = k.scanAfter
	return nvmehost.Controller{Name: name}, nil
}

func (k *pathKernel) Namespaces(name string) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids, ok := k.ns[name]
	if !ok {
		return nil, nvmehost.ErrNoController
	}
	if n, ok := k.pending[name]; ok && n >= 0 {
		if n == 0 {
			k.ns[name] = []string{"1", "2"}
			delete(k.pending, name)
		} else {
			k.pending[name] = n - 1
		}
	}
	return ids, nil
}

func (k *pathKernel) Delete(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.ns[name]; !ok {
		return nvmehost.ErrNoController
	}
	delete(k.ns, name)
	k.deleted = append(k.deleted, name)
	return nil
}

func (k *pathKernel) SetDHCHAP(string, string, string) error { return nil }
func (k *pathKernel) Info(string) (nvmehost.Info, error)     { return nvmehost.Info{}, nil }
func (k *pathKernel) Controllers() ([]nvmehost.Info, error)  { return nil, nil }
func (k *pathKernel) Multipath() bool                        { return true }

func bidirectional(t *testing.T) nvmefmt.Connection {
	t.Helper()
	key := func(b byte) string {
		s, err := nvmefmt.EncodeDHCHAP(nvmefmt.SHA256, bytes.Repeat([]byte{b}, 32))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return nvmefmt.Connection{
		HostNQN:      "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000",
		SubsystemNQN: "nqn.2026-01.io.example:a",
		Ports:        []nvmefmt.Endpoint{{Transport: "tcp", Address: "127.0.0.1", ServiceID: "4420"}},
		DHCHAPKey:    key(1), DHCHAPCtrlKey: key(2),
	}
}

// A re-key by a new path deletes the old path only once the new one
// serves the same namespaces: before that, the namespaces would lose
// their last path and the kernel their block devices.
func TestRekeyNewPathWaitsForNamespaces(t *testing.T) {
	k := &pathKernel{ns: map[string][]string{"nvme0": {"1", "2"}}, pending: map[string]int{}, scanAfter: 3}
	a := &Agent{Kernel: k, PathWait: 5 * time.Second}
	r, err := a.rekey("nvme0", bidirectional(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.ctrl != "nvme1" || strings.Join(k.deleted, ",") != "nvme0" {
		t.Fatalf("rekey = %+v, deleted %v; want nvme1 to replace nvme0", r, k.deleted)
	}
	if k.pending["nvme1"] != 0 || len(k.ns["nvme1"]) != 2 {
		t.Fatalf("the old path went before the new one served: %v", k.ns)
	}
}

// A new path that never serves the namespaces is taken down again and the
// old path kept: the re-key fails (and the next renewal tries again), the
// block devices stay.
func TestRekeyNewPathWithoutNamespacesKeepsOld(t *testing.T) {
	k := &pathKernel{ns: map[string][]string{"nvme0": {"1", "2"}}, pending: map[string]int{}, scanAfter: -1}
	a := &Agent{Kernel: k, PathWait: 100 * time.Millisecond}
	_, err := a.rekey("nvme0", bidirectional(t))
	if err == nil || !strings.Contains(err.Error(), "nvme0 kept") {
		t.Fatalf("rekey = %v, want a failure that keeps nvme0", err)
	}
	if _, ok := k.ns["nvme0"]; !ok || strings.Join(k.deleted, ",") != "nvme1" {
		t.Fatalf("deleted %v; want only the new path nvme1 gone", k.deleted)
	}
}
