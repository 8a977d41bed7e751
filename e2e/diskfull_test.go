package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// With its disk full the gateway fails closed — every connect it cannot
// record is refused Unavailable, none is acknowledged without its audit
// entry, it does not crash — and it recovers by itself once space is back.
// The state lives on a 16 MiB tmpfs (mounting needs root).
func TestDiskFull(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	if os.Getuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	bin := buildBinaries(t)
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	dir := filepath.Join(mnt, "dev")
	g := startGateway(t, bin, dir)
	acks := filepath.Join(t.TempDir(), "acks")
	bench := func(args ...string) string {
		t.Helper()
		out, _ := cli(t, bin, dir, "admin", append([]string{"bench", "connect", "--acks", acks, "--timeout", "10s"}, args...)...)
		return out
	}
	// The runs before and after the disk fills are bounded by count, not
	// time: on 16 MiB, a second of connects on a fast machine would fill
	// the disk by itself.
	if out := bench("--nodes", "10", "--concurrency", "4", "--duration", "30s", "--requests", "200"); !strings.Contains(out, "errors     0") {
		t.Fatalf("before the disk filled:\n%s", out)
	}

	// Fill the disk while connects are going on.
	before := fileSize(acks)
	cmd := exec.Command(filepath.Join(bin, "nvmegate"), "--dev-dir", dir, "--dev-identity", "admin",
		"bench", "connect", "--acks", acks, "--nodes", "20", "--concurrency", "8", "--duration", "4s")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); fileSize(acks) == before && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	waitOrDump(t, cmd, 2*time.Minute, &out, g) // the run fails: some of its grants could not be recorded
	full := out.String()
	t.Logf("disk filled during the run:\n%s", full)
	codes := regexp.MustCompile(`errors     \d+ \((.*)\)`).FindStringSubmatch(full)
	if codes == nil {
		t.Fatalf("no connect failed with the disk full:\n%s", full)
	}
	// Whichever write failed first — the audit entry, the grant, or the
	// target's configfs tree on the same disk — the refusal is Unavailable
	// and says that nothing was granted.
	if !regexp.MustCompile(`^Unavailable=\d+$`).MatchString(codes[1]) || !regexp.MustCompile(`first Unavailable: .*(nothing was changed|no grant was made)`).MatchString(full) {
		t.Errorf("with the disk full, want only Unavailable refusals that say nothing was granted:\n%s", full)
	}
	if g.cmd.ProcessState != nil {
		t.Fatal("the gateway exited with its disk full")
	}

	// Space is back: service resumes without a restart.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if out := bench("--nodes", "10", "--concurrency", "4", "--duration", "30s", "--requests", "200"); !strings.Contains(out, "errors     0") || !strings.Contains(out, "audit      all 200 acknowledged") {
		t.Fatalf("after space came back:\n%s", out)
	}
	if out, err := cli(t, bin, dir, "admin", "bench", "verify", "--acks", acks); err != nil {
		t.Fatalf("an acknowledged grant is not in the log: %v\n%s", err, out)
	}
}
