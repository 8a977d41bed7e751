package main

import (
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// A zero or negative --ttl is refused before anything is sent, rather than
// silently becoming the gateway's default; a positive or absent one goes
// on to the call (which, with no identity here, fails for that reason).
func TestCLIRefusesNonPositiveTTL(t *testing.T) {
	run := func(args ...string) error {
		a := newApp(io.Discard, io.Discard)
		defer a.close()
		root := a.root()
		root.SetArgs(append([]string{"--addr", "127.0.0.1:1"}, args...))
		return root.Execute()
	}
	connect := []string{"connect", "--job", "job-1", "--subsystem", "nqn.2026-01.io.example:s"}
	renew := []string{"renew", "g_0123456789abcdef"}
	for _, base := range [][]string{connect, renew} {
		for _, ttl := range []string{"-1h", "0s", "0", "-1ns"} {
			err := run(append(slices.Clone(base), "--ttl", ttl)...)
			if err == nil || !strings.Contains(err.Error(), "--ttl must be positive") {
				t.Errorf("%s --ttl %s: %v", base[0], ttl, err)
			}
		}
		for _, extra := range [][]string{{"--ttl", "30m"}, nil} {
			err := run(append(slices.Clone(base), extra...)...)
			if err == nil || !strings.Contains(err.Error(), "an identity is required") {
				t.Errorf("%s %v: %v, want it to reach the call", base[0], extra, err)
			}
		}
	}
}

// The printed nvme connect line splits back into the same arguments in a
// shell: a PSK identity has spaces.
func TestShellJoin(t *testing.T) {
	args := []string{"--nqn=nqn.2026-01.io.x:s", "--tls-key-identity=NVMe1R01 h s d=", "it's", ""}
	line := shellJoin(args)
	got, err := exec.Command("sh", "-c", "eval \"set -- $0\"; for a in \"$@\"; do printf '[%s]' \"$a\"; done", line).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "[--nqn=nqn.2026-01.io.x:s][--tls-key-identity=NVMe1R01 h s d=][it's][]"; string(got) != want {
		t.Errorf("%q splits into %s, want %s", line, got, want)
	}
}
