package nvmegate_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
)

func TestGrantExpiry(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	far := now.Add(24 * time.Hour)
	for _, c := range []struct {
		ttl, max time.Duration
		job      time.Time
		want     time.Duration
	}{
		{0, 0, far, nvmegate.DefaultGrantTTL},                    // none asked: the default
		{-time.Second, 0, far, nvmegate.DefaultGrantTTL},         // nonsense: the default
		{2 * time.Hour, 0, far, 2 * time.Hour},                   // as asked
		{2 * time.Hour, 30 * time.Minute, far, 30 * time.Minute}, // the policy's cap
		{0, 2 * time.Hour, far, nvmegate.DefaultGrantTTL},        // a cap above the default
		{2 * time.Hour, 0, now.Add(time.Minute), time.Minute},    // the job ends first
	} {
		if got := nvmegate.GrantExpiry(now, c.ttl, c.max, c.job); !got.Equal(now.Add(c.want)) {
			t.Errorf("GrantExpiry(ttl %v, max %v, job +%v) = +%v, want +%v", c.ttl, c.max, c.job.Sub(now), got.Sub(now), c.want)
		}
	}
}

func TestApplyObligations(t *testing.T) {
	nvmet := &nvmegate.Target{ID: "t1", Driver: nvmegate.DriverNVMet}
	spdk := &nvmegate.Target{ID: "t2", Driver: nvmegate.DriverSPDK}
	both := &nvmegate.Subsystem{NQN: "nqn.2026-01.io.test:both", DHCHAP: true, TLS: true}
	chap := &nvmegate.Subsystem{NQN: "nqn.2026-01.io.test:chap", DHCHAP: true}
	for _, c := range []struct {
		name    string
		sub     *nvmegate.Subsystem
		t       *nvmegate.Target
		ob      nvmegate.Obligations
		want    nvmegate.Grant // the fields set
		wantErr string
	}{
		{"defaults", chap, nvmet, nvmegate.Obligations{}, nvmegate.Grant{DHCHAPHash: "sha256", DHGroup: "ffdhe2048"}, ""},
		{"minimums", chap, nvmet, nvmegate.Obligations{MinHash: "sha512", MinDHGroup: "ffdhe4096", Bidirectional: true, ReadOnly: true},
			nvmegate.Grant{DHCHAPHash: "sha512", DHGroup: "ffdhe4096", Bidirectional: true, ReadOnly: true}, ""},
		{"tls and chap", both, spdk, nvmegate.Obligations{RequireTLS: true}, nvmegate.Grant{DHCHAPHash: "sha256", DHGroup: "ffdhe2048", TLS: true}, ""},
		{"tls only", both, spdk, nvmegate.Obligations{AuthMode: nvmegate.AuthTLS, Bidirectional: true}, nvmegate.Grant{DHCHAPHash: "none", TLS: true}, ""},
		{"no tls port", chap, spdk, nvmegate.Obligations{RequireTLS: true}, nvmegate.Grant{}, "has no TLS port"},
		{"tls and chap on nvmet", both, nvmet, nvmegate.Obligations{AuthMode: nvmegate.AuthBoth, RequireTLS: true},
			nvmegate.Grant{DHCHAPHash: "sha256", DHGroup: "ffdhe2048", TLS: true}, ""},
		{"tls only on nvmet", both, nvmet, nvmegate.Obligations{AuthMode: nvmegate.AuthTLS}, nvmegate.Grant{}, "needs DH-HMAC-CHAP too"},
		{"no chap", &nvmegate.Subsystem{NQN: "nqn.2026-01.io.test:tls", TLS: true}, spdk, nvmegate.Obligations{}, nvmegate.Grant{}, "does not do DH-HMAC-CHAP"},
	} {
		g := &nvmegate.Grant{}
		err := g.ApplyObligations(c.sub, c.t, c.ob)
		if c.wantErr != "" {
			if nvmegate.ErrorCode(err) != nvmegate.ECONFLICT || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: %v, want a conflict saying %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || *g != c.want {
			t.Errorf("%s: %+v (%v), want %+v", c.name, *g, err, c.want)
		}
	}
}

// Grants sharing a host entry agree on the strongest authentication any of
// them needs; TLS and DH-HMAC-CHAP do not mix.
func TestJoinHostEntry(t *testing.T) {
	g := &nvmegate.Grant{HostNQN: "h", KeyScope: "target:t1", DHCHAPHash: "sha256", DHGroup: "ffdhe4096"}
	o := &nvmegate.Grant{ID: "o", HostNQN: "h", SubsystemNQN: "s2", KeyScope: "target:t1", DHCHAPHash: "sha512", DHGroup: "ffdhe2048", Bidirectional: true}
	if !g.SharesHostEntry(o) || g.SharesHostEntry(&nvmegate.Grant{HostNQN: "h", SubsystemNQN: "s3"}) {
		t.Fatal("SharesHostEntry: same host and key scope only")
	}
	if err := g.JoinHostEntry(o); err != nil {
		t.Fatal(err)
	}
	want := nvmegate.HostEntry{DHCHAPHash: "sha512", DHGroup: "ffdhe4096", Bidirectional: true}
	if g.HostEntry() != want {
		t.Fatalf("joined entry %+v, want %+v", g.HostEntry(), want)
	}
	tls := &nvmegate.Grant{ID: "tls", HostNQN: "h", KeyScope: "target:t1", DHCHAPHash: "none", TLS: true}
	if err := g.JoinHostEntry(tls); nvmegate.ErrorCode(err) != nvmegate.ECONFLICT || !strings.Contains(err.Error(), "secured by TLS, this one by DH-HMAC-CHAP") {
		t.Fatalf("TLS beside DH-HMAC-CHAP: %v", err)
	}
}
