package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// Usage errors are refused before anything connects. (The agent's run
// against a gateway is in the demo, which e2e runs: a separate process
// programs stor-eu-1.)
func TestUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no driver":   {[]string{"--dev-dir", "x", "--dev-identity", "y"}, "give --nvmet-root"},
		"two drivers": {[]string{"--nvmet-root", "/r", "--spdk-socket", "/s", "--spdk-key-dir", "/k"}, "give --nvmet-root"},
		"spdk no dir": {[]string{"--spdk-socket", "/s"}, "give --nvmet-root"},
		"stray arg":   {[]string{"--nvmet-root", "/r", "extra"}, "unexpected argument"},
		"no identity": {[]string{"--nvmet-root", "/r"}, "an identity is required"},
		"half dev":    {[]string{"--nvmet-root", "/r", "--dev-dir", "x"}, "go together"},
		"no dev gw":   {[]string{"--nvmet-root", "/r", "--dev-dir", t.TempDir(), "--dev-identity", "target-stor-eu-1"}, "no running dev gateway"},
	} {
		t.Run(name, func(t *testing.T) {
			err := run(context.Background(), tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}
