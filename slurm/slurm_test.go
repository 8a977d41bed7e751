package slurm_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/slurm"
)

func TestParseComment(t *testing.T) {
	got, err := slurm.ParseComment("llm run 7 nvmegate:common-crawl/2026-10,ckpt/llm-7:rw see wiki")
	want := []slurm.Dataset{{Name: "common-crawl/2026-10", Mode: "ro"}, {Name: "ckpt/llm-7", Mode: "rw"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ParseComment = %v, %v; want %v", got, err, want)
	}
	if got, err := slurm.ParseComment("just a note"); got != nil || err != nil {
		t.Fatalf("a comment without the field: %v, %v; want nothing asked", got, err)
	}
	for comment, msg := range map[string]string{
		"nvmegate:":             "names no dataset",
		"nvmegate:a:wx":         `mode "wx" is not ro or rw`,
		"nvmegate:a,a:rw":       "asked for twice",
		"nvmegate:a nvmegate:b": "two",
		"nvmegate:../x":         "dataset",
		"nvmegate:" + many(70):  "more than 64",
	} {
		if _, err := slurm.ParseComment(comment); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseComment(%q) = %v, want an error saying %q", comment, err, msg)
		}
	}
}

func many(n int) string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("d%d", i)
	}
	return strings.Join(names, ",")
}

func TestJobFromEnv(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_USER": "alice",
		"SLURM_JOB_COMMENT": "nvmegate:x", "SLURM_JOB_RESTART_COUNT": "2", "SLURM_JOB_UID": "1000"}
	j, err := slurm.JobFromEnv(func(k string) string { return env[k] })
	if err != nil || j != (slurm.Job{ID: "4242", Nodes: "gpu[01-02]", User: "alice", Comment: "nvmegate:x", Restarts: 2, UID: 1000}) {
		t.Fatalf("JobFromEnv = %+v, %v", j, err)
	}
	env["SLURM_JOB_RESTART_COUNT"] = "x"
	if _, err := slurm.JobFromEnv(func(k string) string { return env[k] }); err == nil {
		t.Fatal("a malformed restart count was read")
	}
	if _, err := slurm.JobFromEnv(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "Slurm job hook") {
		t.Fatalf("outside a hook: %v", err)
	}
	if _, err := slurm.JobFromEnv(func(k string) string { return map[string]string{"SLURM_JOB_ID": "../etc"}[k] }); err == nil {
		t.Fatal("a job ID that is a path was read")
	}
}

func TestParseSqueue(t *testing.T) {
	w, err := slurm.ParseSqueue("2026-12-07T21:00:05|1-02:03:04\n", time.UTC)
	want := slurm.Window{Start: time.Date(2026, 12, 7, 21, 0, 5, 0, time.UTC), Limit: 26*time.Hour + 3*time.Minute + 4*time.Second}
	if err != nil || w != want {
		t.Fatalf("ParseSqueue = %+v, %v; want %+v", w, err, want)
	}
	if w, err := slurm.ParseSqueue("2026-12-07T21:00:05|UNLIMITED", time.UTC); err != nil || !w.Unlimited {
		t.Fatalf("unlimited: %+v, %v", w, err)
	}
	for _, bad := range []string{"", "2026-12-07T21:00:05", "soon|10:00", "2026-12-07T21:00:05|1:2:3:4", "2026-12-07T21:00:05|10:99",
		"2026-12-07T21:00:05|10:00|StartTime=2099-01-01T00:00:00"} {
		if _, err := slurm.ParseSqueue(bad, time.UTC); err == nil {
			t.Errorf("ParseSqueue(%q) succeeded", bad)
		}
	}
	for s, want := range map[string]time.Duration{"10:00": 10 * time.Minute, "01:00:00": time.Hour, "2-00:00:00": 48 * time.Hour} {
		if got, err := slurm.ParseTimeLimit(s); err != nil || got != want {
			t.Errorf("ParseTimeLimit(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := slurm.ParseConfig(strings.NewReader(`# the cluster's hooks
tenant = acme
regions = eu-west, eu-central
addr = gw-0:7443,gw-1:7443
spiffe-socket = unix:///run/spire/agent.sock
expiry-margin = 5m
`), []string{"addr", "spiffe-socket"})
	if err != nil || c.Tenant != "acme" || !reflect.DeepEqual(c.Regions, []string{"eu-west", "eu-central"}) ||
		c.Identity["addr"] != "gw-0:7443,gw-1:7443" || c.ExpiryMargin != 5*time.Minute || c.Scontrol != "/usr/bin/scontrol" {
		t.Fatalf("ParseConfig = %+v, %v", c, err)
	}
	for text, msg := range map[string]string{
		"tenant = acme\nregions = x\nbogus = 1":         `unknown key "bogus"`,
		"tenant = acme\nregions":                        "line 2: want key = value",
		"tenant = acme":                                 "required",
		"tenant = a\nregions = x\nexpiry-margin = soon": "expiry-margin",
	} {
		if _, err := slurm.ParseConfig(strings.NewReader(text), nil); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseConfig(%q) = %v, want %q", text, err, msg)
		}
	}
}

func TestParseNodeConfig(t *testing.T) {
	c, err := slurm.ParseNodeConfig(strings.NewReader("spiffe-socket = unix:///run/spire/agent.sock\nkeyring = nvmegate-node\nconnect-timeout = 90s\n"),
		[]string{"spiffe-socket", "keyring", "job", "status-socket"})
	if err != nil || c.Agent["spiffe-socket"] != "unix:///run/spire/agent.sock" || c.Agent["keyring"] != "nvmegate-node" ||
		c.ConnectTimeout != 90*time.Second || c.RunDir != "/run/nvmegate/jobs" {
		t.Fatalf("ParseNodeConfig = %+v, %v", c, err)
	}
	// The hook sets the job and the status socket itself.
	for _, text := range []string{"job = x", "status-socket = /tmp/s", "bogus = 1"} {
		if _, err := slurm.ParseNodeConfig(strings.NewReader(text), []string{"job", "status-socket"}); err == nil || !strings.Contains(err.Error(), "unknown key") {
			t.Errorf("ParseNodeConfig(%q) = %v, want unknown key", text, err)
		}
	}
}
