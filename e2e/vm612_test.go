package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRealKernel612 boots Debian's own Linux 6.12 (e2e/vm/fetch-kernel-6.12.sh)
// with tlshd, nvme-cli 2.13 and keyctl from Debian 13 and runs
// e2e/vm/story-6.12.sh: NVMe/TCP with TLS end to end. The target agent puts
// each granted host's PSK in the kernel's .nvme keyring; tlshd keys the
// sessions with it; a wrong PSK is refused; after a revocation the host is
// refused. And the host NQN under TLS: on a TLS-only nvmet subsystem a host
// holding host A's PSK connects as host B (Linux 6.12 does not compare the
// PSK's identity with the Connect's host NQN); with nvmegate's grants,
// which carry DH-HMAC-CHAP inside the TLS session on nvmet, the same
// attempt is refused by the kernel.
func TestRealKernel612(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: boots a VM")
	}
	kdir := builtByMake(t, "NVMEGATE_VM612_KERNEL", "the 6.12 kernel with e2e/vm/fetch-kernel-6.12.sh")
	userland := builtByMake(t, "NVMEGATE_VM612_USERLAND", "the 6.12 tier's user space with e2e/vm/fetch-userland-trixie.sh")
	root := repoRoot(t)
	// A connect the target ends as a fatal error mid-authentication hangs
	// the host for several admin timeouts (4 minutes at the default 60 s,
	// seen once under emulation): 10 s bounds it within the story's time.
	// NVMEGATE_VM612_PROBES=1 also runs the probes of the kernel's own
	// behaviour that can hang it (story-6.12.sh: bidir-rekey).
	probes := os.Getenv("NVMEGATE_VM612_PROBES") == "1"
	appendArgs := "nvme_core.admin_timeout=10"
	if probes {
		appendArgs += " nvmegate.probes=1"
	}
	steps := runVM(t, vmRun{Kernel: filepath.Join(kdir, "vmlinuz"), Append: appendArgs, ConsoleEnv: "NVMEGATE_VM612_CONSOLE", Env: []string{
		"VM_MODULES=" + filepath.Join(kdir, "modules"), "VM_USERLAND=" + userland,
		"VM_STORY=" + filepath.Join(root, "e2e", "vm", "story-6.12.sh")}})

	get := func(name string) vmStep {
		t.Helper()
		s, ok := steps[name]
		if !ok {
			t.Fatalf("step %s missing from the console", name)
		}
		return s
	}
	has := func(s vmStep, where, text string) {
		t.Helper()
		if !strings.Contains(map[string]string{"output": s.Output, "kernel": s.Kernel}[where], text) {
			t.Errorf("step %s: the %s lacks %q:\n%s", s.Name, where, text, s.excerpt())
		}
	}
	ok := func(name string, outputHas ...string) vmStep {
		t.Helper()
		s := get(name)
		if s.Exit != 0 {
			t.Errorf("step %s failed:\n%s", name, s.excerpt())
		}
		for _, w := range outputHas {
			has(s, "output", w)
		}
		return s
	}
	refused := func(name string) vmStep {
		t.Helper()
		s := get(name)
		if s.Exit == 0 || s.Exit == 2 || strings.Contains(s.Output, "block device") {
			t.Errorf("step %s: want the connect refused by the kernel:\n%s", name, s.excerpt())
		}
		return s
	}

	ok("kernel", "6.12.", "keyring   .nvme:", "nvme version 2.13")
	ok("tlshd", "tlshd running", "ktls-utils 1.0.0")

	// Before: TLS alone on nvmet; A's PSK, B's name: the kernel lets it in.
	ok("impersonation-before-setup", "addr_tsas tls1.3, addr_treq required")
	before := ok("impersonation-before", "was successful", "block device /dev/nvme", "1+0 records out")
	has(before, "kernel", "for NQN nqn.2014-08.org.nvmexpress:uuid:0000000b-")
	if strings.Contains(before.Kernel, "with DH-HMAC-CHAP") {
		t.Errorf("the TLS-only subsystem authenticated with DH-HMAC-CHAP:\n%s", before.excerpt())
	}
	ok("impersonation-before-teardown", "removed")

	for _, n := range []string{"gateway", "target-add", "acme-subsystem-add", "acme-namespace-add", "acme-host-1", "acme-host-2",
		"operator-namespace", "agent", "acme-job", "grant-node1", "grant-node2"} {
		ok(n)
	}
	node1 := hostNQNIn(t, ok("acme-host-1").Output)
	// The target agent put node 1's PSK in .nvme under the identities a
	// host may present: v0, and v1 by either derivation.
	keys := ok("keys-after-grant").Output
	if n := strings.Count(keys, "R01 "+node1+" nqn.2026-01.io.nvmegate.vm:acme-train"); n != 3 || !strings.Contains(keys, "NVMe0R01 "+node1) {
		t.Errorf("keys after the grant: %d identities of node 1, want 3 (v0 and two v1):\n%s", n, keys)
	}
	has(ok("tree-after-grant"), "output", "f ports/1/addr_treq required")

	// TLS and DH-HMAC-CHAP inside it: both sides of tlshd report the
	// handshake, the kernel authenticates the host, a block is read.
	c1 := ok("tls-connect-node1", "block device /dev/nvme", "1+0 records out", "was successful")
	has(c1, "kernel", "qid 0: authenticated with hash hmac(sha256) dhgroup ffdhe2048")
	has(c1, "kernel", "with DH-HMAC-CHAP")
	has(ok("tls-key-node1", "state live, TLS key"), "output", node1)
	// A live re-key: rotation, renewal, the new secret written to the
	// controller's sysfs attribute; the kernel re-authenticates the live
	// controller, and the read loop over the fabric saw no error.
	rk := ok("rekey-live", "errors 0", "state live")
	has(rk, "kernel", "re-authenticating controller")
	has(rk, "kernel", "qid 0: authenticated with hash hmac(sha256)")
	if strings.Contains(rk.Kernel, "new ctrl") || strings.Contains(rk.Output, "reads 0 ") {
		t.Errorf("rekey-live: a reconnect, or no reads:\n%s", rk.excerpt())
	}
	// The re-key replaced node 1's PSKs in .nvme: as many, all new.
	granted, rekeyed := nodeKeys(ok("keyids-after-grant").Output, node1), nodeKeys(ok("keyids-after-rekey").Output, node1)
	if len(granted) != 3 || len(rekeyed) != 3 {
		t.Errorf("node 1's PSKs: %d before the re-key, %d after, want 3 and 3", len(granted), len(rekeyed))
	}
	for _, k := range rekeyed {
		if slices.Contains(granted, k) {
			t.Errorf("node 1's PSK %s is still in .nvme after the re-key", k)
		}
	}
	refused("tls-old-after-rekey")
	wrong := refused("tls-wrong-psk")
	has(wrong, "output", "failed to search 'psk' key")
	has(wrong, "kernel", "TLS handshake complete, error")
	ok("tls-connect-node2", "block device /dev/nvme", "was successful")

	// After: node 1's PSK, node 2's name. TLS succeeds, DH-HMAC-CHAP does
	// not: without a secret, and with node 1's own secret.
	noKey := refused("impersonation-after")
	has(noKey, "output", "was successful")
	has(noKey, "kernel", "authentication setup failed")
	own := refused("impersonation-after-own-secret")
	has(own, "kernel", "host response mismatch")
	has(own, "kernel", "authentication failed")

	// Revocation: node 1's keys leave .nvme and the host leaves the target.
	ok("revoke-node1", "revoked 1 grant(s)")
	if k := ok("keys-after-revoke").Output; strings.Contains(k, node1) {
		t.Errorf("node 1's PSKs are still in .nvme after its revocation:\n%s", k)
	}
	// Refused at the handshake (its PSK left .nvme) or, had it got
	// through, at the Connect (the host left the subsystem).
	if r := refused("tls-after-revoke"); !strings.Contains(r.Output, "failed to search 'psk' key") && !strings.Contains(r.Kernel, "not allowed") {
		t.Errorf("tls-after-revoke: neither tlshd nor the kernel says why it refused:\n%s", r.excerpt())
	}
	ok("finish-job", "finished")
	if k := ok("keys-after-finish").Output; strings.Contains(k, "acme-train") {
		t.Errorf("PSKs left in .nvme after the job finished:\n%s", k)
	}
	if tr := ok("tree-after-finish").Output; strings.Contains(tr, "allowed_hosts") {
		t.Errorf("hosts left on the target after the job finished:\n%s", tr)
	}
	// The node agent with TLS: its own keyring holds the PSK under the
	// identity the kernel looks up; the controller is keyed by it; a live
	// re-key, the old secret refused (inside a TLS session the new PSK
	// opens), nothing left after SIGTERM, and no key left in its ring.
	kernelRefuses := func(name string, why ...string) {
		t.Helper()
		s := refused(name)
		if !slices.ContainsFunc(why, func(w string) bool { return strings.Contains(s.Kernel, w) }) {
			t.Errorf("step %s: the kernel log has none of %q:\n%s", name, why, s.excerpt())
		}
	}
	checkNodeAgent(t, ok, kernelRefuses, "acme-gpu-1", "qid 0: authenticated with hash hmac(sha256) dhgroup ffdhe2048", false)
	has(ok("agent-tls", "state live", "NVMe0R01 "+node1+" nqn.2026-01.io.nvmegate.vm:acme-train"), "output", "was successful")
	ok("agent-keys-after-stop", "nvmegate-node ring: 0 key(s)")
	// The CSI driver's node plugin stages over TLS with DH-HMAC-CHAP, and
	// its unstage leaves no key in its ring.
	ok("csi-tls-plugins", "node1 serving")
	ok("csi-tls-create", "volume nqn.2026-01.io.nvmegate.vm:acme-train/1@team-a.tls-1")
	ok("csi-tls-pod", "ControllerPublishVolume OK", "NodeStageVolume OK", "NodePublishVolume OK", ": block device ")
	has(ok("csi-tls-key", "state live", "NVMe0R01 "+node1+" nqn.2026-01.io.nvmegate.vm:acme-train"), "output", "was successful")
	ok("csi-tls-read", "pod pod-t read 65536 bytes of its dataset")
	ok("csi-tls-detach", "NodeUnpublishVolume OK", "NodeUnstageVolume OK", "ControllerUnpublishVolume OK")
	ok("csi-tls-keys-after", "nvmegate-node ring: 0 key(s)")
	// Encryption at rest (checkAtRest, e2e/vm_test.go), over TLS.
	checkAtRest(t, ok, "Linux 6.12")

	// The figures: connect time with and without TLS and DH-HMAC-CHAP
	// (logged for docs/PERFORMANCE.md; only their presence is checked:
	// this machine's speed is not the test's business).
	ok("timing-target", "2 PSKs in .nvme")
	// A bidirectional live re-key on this kernel, by hand: what happened
	// is logged (the agent re-keys bidirectional grants by a new path on
	// any kernel); that it connected and read, and an outcome, are checked.
	// It hangs the guest's kernel in some runs, so it runs only when
	// asked (NVMEGATE_VM612_PROBES=1).
	if probes {
		bd := ok("bidir-rekey", "connected", "with both secrets, state live", "reads ", "outcome: controller")
		t.Logf("bidirectional live re-key on Linux 6.12:\n%s\nkernel:\n%s", bd.Output, bd.Kernel)
	}
	tm := ok("timing", "timing plain: mean", "timing dhchap: mean", "timing tls: mean", "timing tls+dhchap: mean", "queues per connect")
	t.Logf("connect times (Linux 6.12 under TCG):\n%s", tm.Output)
	ok("gateway-log", "/tmp/gateway.log:0", "/tmp/agent.log:0", "/tmp/tlshd.log:0", "/tmp/node.log:0")
}

// nodeKeys are the serials of node's PSKs in keyids' output (lines of
// "<serial> <identity>").
func nodeKeys(out, node string) []string {
	var serials []string
	for _, line := range strings.Split(out, "\n") {
		if serial, id, ok := strings.Cut(strings.TrimSpace(line), " "); ok && strings.Contains(id, " "+node+" ") {
			serials = append(serials, serial)
		}
	}
	return serials
}
