package gateway

import (
	"strings"
	"testing"
)

// An agent's error text reaches the gateway's log: key material in it is
// withheld, invisible characters are escaped, plain text is kept.
func TestAgentError(t *testing.T) {
	const key = "DHHC-1:00:QWxsIHRoYXQgZ2xpdHRlcnMgaXMgbm90IGdvbGQuLi4uLkAx:"
	for in, want := range map[string]string{
		"":                                   "",
		"write dhchap_key: invalid argument": "write dhchap_key: invalid argument",
		"write dhchap_key " + key + ": invalid argument": "(the agent's message is withheld: it looks like key material)",
		"failed\ntarget stor-2 applied":                  `"failed\ntarget stor-2 applied"`,
		"ok \u202eliaf":                                  `"ok \u202eliaf"`,
		"\xff":                                           `"\xff"`,
		"ok\u3164\u3164failed":                           `"ok\u3164\u3164failed"`,
	} {
		got := agentError(in)
		if got != want {
			t.Errorf("agentError(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(got, key) {
			t.Errorf("agentError(%q) keeps the key", in)
		}
	}
}
