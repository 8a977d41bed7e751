package nvmet_test

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/fabric/nvmet/nvmettest"
)

var update = flag.Bool("update", false, "rewrite the golden trees in testdata/")

const (
	sub   = "nqn.2026-01.io.nvmegate.test:acme-train"
	hostA = "nqn.2014-08.org.nvmexpress:uuid:00000001-aaaa-4000-8000-000000000000"
	hostB = "nqn.2014-08.org.nvmexpress:uuid:00000002-aaaa-4000-8000-000000000000"
	// DHHC-1 test keys (fixed, so that the golden trees are stable); they
	// pass nvme check-dhchap-key.
	keyA1 = "DHHC-1:01:sKpQc1nGaocWSUWCMDyUIVzJZfcGvVxKRLWgNfWsdqy1YkTc:"
	keyA2 = "DHHC-1:01:F0kh4zhDTeUynyyQkPFw4ZXI/wgvzRTuL5g7kjhdubo81ukn:"
	keyB1 = "DHHC-1:01:OioJdHDTsA2XNkex0zO3+RHRJuA+koHzq6BRNzQup5DAxWMW:"
	ctrl1 = "DHHC-1:01:shwO4h6qLEsjJTyTW+6OYTGb1v7oQGy2/L+VM2WL7ChYfxmc:"
)

func state(hosts ...fabric.Host) fabric.State {
	return fabric.State{Subsystems: []fabric.Subsystem{{
		NQN:   sub,
		Hosts: hosts,
		Ports: []fabric.Port{{ID: 1, Trtype: "tcp", Adrfam: "ipv4", Traddr: "127.0.0.1", Trsvcid: "4420", Treq: "not required", Tsas: "none"}},
	}}}
}

func host(nqn, key, ctrl string) fabric.Host {
	return fabric.Host{NQN: nqn, DHCHAPKey: key, DHCHAPCtrlKey: ctrl, DHCHAPHash: fabric.Hash("sha384"), DHCHAPGroup: "ffdhe3072"}
}

// dump renders a tree (nvmettest.Dump).
func dump(t testing.TB, root string) string { t.Helper(); return nvmettest.Dump(t, root) }

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./fabric/nvmet -update)", err)
	}
	if got != string(want) {
		t.Fatalf("tree %s differs from %s:\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

// The tree after connect, a second host, rotation, release and the end of
// all access, each compared with its golden tree; applying the same state
// twice changes nothing.
func TestApplyGoldenTrees(t *testing.T) {
	root := t.TempDir()
	d := &nvmet.Driver{Root: root}
	ctx := context.Background()
	steps := []struct {
		name string
		s    fabric.State
	}{
		{"1-connect", state(host(hostA, keyA1, ctrl1))},
		{"2-second-host", state(host(hostA, keyA1, ctrl1), host(hostB, keyB1, ""))},
		{"3-rotate", state(host(hostA, keyA2, ctrl1), host(hostB, keyB1, ""))},
		{"4-release", state(host(hostB, keyB1, ""))},
		{"5-none", state()},
	}
	for _, st := range steps {
		if err := d.Apply(ctx, st.s); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		tree := dump(t, root)
		golden(t, st.name, tree)
		if err := d.Apply(ctx, st.s); err != nil {
			t.Fatal(err)
		}
		if again := dump(t, root); again != tree {
			t.Fatalf("%s: applying twice changed the tree", st.name)
		}
	}
}

// One host with different keys on two subsystems of a target cannot be
// expressed in configfs (one hosts/<nqn> entry): refused, nothing written.
func TestApplyRefusesConflictingHost(t *testing.T) {
	d := &nvmet.Driver{Root: t.TempDir()}
	s := state(host(hostA, keyA1, ""))
	s.Subsystems = append(s.Subsystems, fabric.Subsystem{NQN: sub + "-2", Hosts: []fabric.Host{host(hostA, keyA2, "")}})
	err := d.Apply(context.Background(), s)
	if err == nil || !strings.Contains(err.Error(), "different credentials") {
		t.Fatalf("err = %v", err)
	}
	if strings.Contains(err.Error(), "DHHC-1") {
		t.Fatal("error names a secret")
	}
}

// nvme-cli accepts every key the driver wrote (CI installs it).
func TestWrittenKeysNVMeCLI(t *testing.T) {
	nvme, err := exec.LookPath("nvme")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nvme-cli missing under CI")
		}
		t.Skip("nvme-cli not installed")
	}
	root := t.TempDir()
	if err := (&nvmet.Driver{Root: root}).Apply(context.Background(), state(host(hostA, keyA1, ctrl1), host(hostB, keyB1, ""))); err != nil {
		t.Fatal(err)
	}
	keys, _ := filepath.Glob(filepath.Join(root, "hosts", "*", "dhchap_*key"))
	n := 0
	for _, k := range keys {
		data, _ := os.ReadFile(k)
		v := strings.TrimSpace(string(data))
		if v == "" {
			continue
		}
		n++
		if out, err := exec.Command(nvme, "check-dhchap-key", "-k", v).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", k, err, out)
		}
	}
	if n != 3 {
		t.Fatalf("%d keys checked, want 3", n)
	}
}

// configfs answers readlink with its own path form (up to its mount point
// and down again); such a link is right and must be left alone — unlinking
// a port's subsystem would drop the connections through it.
func TestConfigfsLinkFormKept(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nvmet") // as under /sys/kernel/config
	d := &nvmet.Driver{Root: root, Recheck: -1} // read back every time: this test edits behind its back
	s := state(host(hostA, keyA1, ""))
	if err := d.Apply(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		filepath.Join(root, "subsystems", sub, "allowed_hosts", hostA): "../../../../nvmet/hosts/" + hostA,
		filepath.Join(root, "ports", "1", "subsystems", sub):           "../../../../nvmet/subsystems/" + sub,
	}
	for p, target := range links {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Apply(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	for p, target := range links {
		if got, err := os.Readlink(p); err != nil || got != target {
			t.Errorf("%s: link %q (%v), want the configfs form %q kept", p, got, err, target)
		}
	}
	// A link that leads elsewhere is still replaced.
	wrong := filepath.Join(root, "subsystems", sub, "allowed_hosts", hostA)
	os.Remove(wrong)
	if err := os.Symlink("../../../../nvmet/hosts/"+hostB, wrong); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(wrong); got != filepath.Join(root, "hosts", hostA) {
		t.Errorf("a wrong link was kept: %q", got)
	}
}

// The driver remembers what it wrote: an unchanged host is not read back
// until Recheck has passed, a changed one is rewritten at once, and a
// driver that always rechecks repairs an edit made behind its back.
func TestDriverRemembers(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nvmet")
	d := &nvmet.Driver{Root: root, Recheck: time.Hour}
	ctx := context.Background()
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyB1, ""))); err != nil {
		t.Fatal(err)
	}
	hashA := filepath.Join(root, "hosts", hostA, "dhchap_hash")
	keyB := filepath.Join(root, "hosts", hostB, "dhchap_key")
	if err := os.WriteFile(hashA, []byte("hmac(sha512)\n"), 0o644); err != nil { // an edit behind its back
		t.Fatal(err)
	}
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyA2, ""))); err != nil { // B re-keyed
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(hashA); string(got) != "hmac(sha512)\n" {
		t.Errorf("an unchanged, remembered host was read back and rewritten: %q", got)
	}
	if got, _ := os.ReadFile(keyB); string(got) != keyA2+"\n" {
		t.Errorf("the re-keyed host was not rewritten")
	}
	fresh := &nvmet.Driver{Root: root, Recheck: -1}
	if err := fresh.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyA2, ""))); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(hashA); string(got) != "hmac(sha384)\n" {
		t.Errorf("a rechecking driver left the edit: %q", got)
	}
	// A removed host is forgotten: adding it back writes it again.
	if err := d.Apply(ctx, state(host(hostB, keyA2, ""))); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyA2, ""))); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "hosts", hostA, "dhchap_key")); err != nil || string(got) != keyA1+"\n" {
		t.Errorf("a host added back was not written: %q %v", got, err)
	}
}

// A host whose grant becomes unidirectional loses its controller key on
// the target: configfs cannot clear the attribute, so the entry is made
// anew (unlinked, removed, written, linked again).
func TestApplyDropsControllerKey(t *testing.T) {
	root := t.TempDir()
	d := &nvmet.Driver{Root: root}
	ctx := context.Background()
	if err := d.Apply(ctx, state(host(hostA, keyA1, ctrl1), host(hostB, keyB1, ctrl1))); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(ctx, state(host(hostA, keyA2, ""), host(hostB, keyB1, ctrl1))); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(root, "hosts", hostA)
	if data, err := os.ReadFile(filepath.Join(hostDir, "dhchap_ctrl_key")); err == nil && strings.TrimSpace(string(data)) != "" {
		t.Fatal("hostA keeps its old controller key")
	}
	if key, _ := os.ReadFile(filepath.Join(hostDir, "dhchap_key")); strings.TrimSpace(string(key)) != keyA2 {
		t.Fatalf("hostA's key %q, want the new one", key)
	}
	for _, h := range []string{hostA, hostB} {
		if _, err := os.Readlink(filepath.Join(root, "subsystems", sub, "allowed_hosts", h)); err != nil {
			t.Fatalf("%s is not allowed any more: %v", h, err)
		}
	}
	if ck, _ := os.ReadFile(filepath.Join(root, "hosts", hostB, "dhchap_ctrl_key")); strings.TrimSpace(string(ck)) != ctrl1 {
		t.Fatal("hostB, still bidirectional, lost its controller key")
	}
	// Applying the same state again touches nothing.
	tree := dump(t, root)
	if err := d.Apply(ctx, state(host(hostA, keyA2, ""), host(hostB, keyB1, ctrl1))); err != nil {
		t.Fatal(err)
	}
	if dump(t, root) != tree {
		t.Fatal("applying twice changed the tree")
	}
}

// The same state again (a new generation, same content) is not applied
// again within Recheck; a changed one is.
func TestDriverSkipsUnchangedState(t *testing.T) {
	root := filepath.Join(t.TempDir(), "nvmet")
	d := &nvmet.Driver{Root: root, Recheck: time.Hour}
	ctx := context.Background()
	st := state(host(hostA, keyA1, ""))
	st.Generation = 1
	if err := d.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "subsystems", sub, "allowed_hosts", hostA)
	if err := os.Remove(link); err != nil { // a change behind its back
		t.Fatal(err)
	}
	st.Generation = 2
	if err := d.Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); err == nil {
		t.Fatal("an unchanged state was applied again")
	}
	// A state that differs (hostB added) is applied.
	if err := d.Apply(ctx, state(host(hostA, keyA1, ""), host(hostB, keyB1, ""))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, "subsystems", sub, "allowed_hosts", hostB)); err != nil {
		t.Fatalf("a changed state was not applied: %v", err)
	}
	// A driver that always rechecks applies even the same state again.
	again := &nvmet.Driver{Root: root, Recheck: -1}
	for range 2 {
		if err := again.Apply(ctx, st); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(link); err != nil {
			t.Fatalf("a rechecking driver did not restore the link: %v", err)
		}
		os.Remove(link)
	}
}

// Host NQNs may hold glob characters: dropping one host's controller key
// touches that host only.
func TestDropControllerKeyGlobNQN(t *testing.T) {
	root := t.TempDir()
	d := &nvmet.Driver{Root: root}
	ctx := context.Background()
	odd, other := "nqn.2014-08.org.example:host[1]*", "nqn.2014-08.org.example:host[1]x"
	if err := d.Apply(ctx, state(host(odd, keyA1, ctrl1), host(other, keyB1, ctrl1))); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(ctx, state(host(odd, keyA1, ""), host(other, keyB1, ctrl1))); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(root, "hosts", odd, "dhchap_ctrl_key")); err == nil && strings.TrimSpace(string(data)) != "" {
		t.Fatal("the host keeps its old controller key")
	}
	for _, h := range []string{odd, other} {
		if _, err := os.Readlink(filepath.Join(root, "subsystems", sub, "allowed_hosts", h)); err != nil {
			t.Fatalf("%s is not allowed any more: %v", h, err)
		}
	}
	if ck, _ := os.ReadFile(filepath.Join(root, "hosts", other, "dhchap_ctrl_key")); strings.TrimSpace(string(ck)) != ctrl1 {
		t.Fatal("the other host lost its controller key")
	}
}
