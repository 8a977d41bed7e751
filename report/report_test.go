package report_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/report"
)

// logged writes a job's story into a real log, exports it and verifies
// the export offline: three grants (one released, one revoked, one still
// active), a renewal, a refusal, a renewal deadline and a compliance
// attestation.
func logged(t *testing.T) (string, []attest.PublicKey, *audit.Report, []audit.Record) {
	t.Helper()
	key, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewLocalSigner(key, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"), audit.Options{Origin: "test/report", Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	node := func(n string) string { return "spiffe://test/node/" + n }
	sub := "nqn.2026-01.io.test:acme"
	dec := &audit.Decision{Allow: true, ID: "d1", PolicyRevision: "rev-1"}
	for _, e := range []audit.Entry{
		{Time: at(0), Kind: audit.EventJobAdmit, JobID: "job-1", Tenant: "acme", Caller: "spiffe://test/tenant/acme/scheduler/s"},
		{Time: at(1), Kind: audit.EventGrant, JobID: "job-1", Tenant: "acme", Caller: node("a"), SubsystemNQN: sub, GrantID: "g-aaaaaaaa", ExpiresAt: at(61), Decision: dec,
			Keys: []audit.KeyRef{{Class: "access_root", ID: "target:t1", Version: 1, Fingerprint: "hmac-sha256:ab"}}},
		{Time: at(2), Kind: audit.EventGrant, JobID: "job-1", Tenant: "acme", Caller: node("b"), SubsystemNQN: sub, GrantID: "g-bbbbbbbb", ExpiresAt: at(62), Decision: dec},
		{Time: at(3), Kind: audit.EventGrant, JobID: "job-1", Tenant: "acme", Caller: node("c"), SubsystemNQN: sub, GrantID: "g-cccccccc", ExpiresAt: at(600), Decision: dec},
		{Time: at(4), Kind: audit.EventDeny, JobID: "job-1", Tenant: "acme", Caller: node("x"), SubsystemNQN: sub, Detail: "access.connect job-1: not in the job",
			Decision: &audit.Decision{ID: "d2", PolicyRevision: "rev-1", Reasons: []string{"not in the job"}}},
		{Time: at(5), Kind: audit.EventRenew, JobID: "job-1", Tenant: "acme", Caller: node("a"), SubsystemNQN: sub, GrantID: "g-aaaaaaaa", ExpiresAt: at(65), Decision: dec},
		{Time: at(6), Kind: audit.EventRelease, JobID: "job-1", Tenant: "acme", Caller: node("a"), SubsystemNQN: sub, GrantID: "g-aaaaaaaa"},
		{Time: at(7), Kind: audit.EventReauth, JobID: "job-1", Tenant: "acme", Caller: "spiffe://test/gateway/g", SubsystemNQN: sub, GrantID: "g-cccccccc", Detail: "must renew"},
		{Time: at(8), Kind: audit.EventRevoke, JobID: "job-1", Tenant: "acme", Caller: "spiffe://test/gateway/g", SubsystemNQN: sub, GrantID: "g-bbbbbbbb",
			Detail: "re-decided after policy revision rev-2 loaded", Decision: &audit.Decision{ID: "d3", PolicyRevision: "rev-2", Reasons: []string{"residency"}}},
		{Time: at(9), Kind: audit.EventComplianceAttestation, Caller: "spiffe://test/gateway/g", Detail: "sha256:00"},
	} {
		if _, _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "export")
	if _, err := l.Export(ctx, dir, 0); err != nil {
		t.Fatal(err)
	}
	keys := []attest.PublicKey{s.PublicKey()}
	ver, err := audit.Verify(ctx, dir, keys, nil, nil)
	if err != nil || !ver.OK() {
		t.Fatalf("verify: %v %v", ver, err)
	}
	recs, err := audit.ExportRecords(dir, ver.TreeSize)
	if err != nil || len(recs) != 10 {
		t.Fatalf("records: %d, %v", len(recs), err)
	}
	return dir, keys, ver, recs
}

func render(t *testing.T, ver *audit.Report, recs []audit.Record) string {
	t.Helper()
	var b bytes.Buffer
	if err := report.HTML(&b, report.Input{Title: "job job-1", Verification: ver, Records: recs,
		Now: time.Date(2026, 12, 3, 10, 30, 0, 0, time.UTC)}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The page: verified first, one bar per grant coloured by how it ended,
// the refusal and the deadline as markers, both policy revisions, the key
// version and the attestation; self-contained.
func TestReportPage(t *testing.T) {
	_, _, ver, recs := logged(t)
	page := render(t, ver, recs)
	for _, want := range []string{
		`<strong id="verdict">Verified</strong>`, `<span id="tree-size">10</span>`,
		`class="grant release" data-grant="g-aaaaaaaa"`, `class="grant revoke" data-grant="g-bbbbbbbb"`, `class="grant open" data-grant="g-cccccccc"`,
		`<circle class="deny"`, `<circle class="reauth_required"`, `<circle class="renew"`, "rev-1", "rev-2", "access_root target:t1 v1", "sha256:00",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if n := strings.Count(page, `<rect class="grant`); n != 3 {
		t.Errorf("%d bars, want 3 (one per grant)", n)
	}
	if regexp.MustCompile(`(?i)(src|href)=|<script|@import|url\(`).MatchString(page) {
		t.Error("the page refers to something outside itself")
	}
}

// A log that does not verify says so first.
func TestReportShowsAFailedVerification(t *testing.T) {
	dir, keys, _, _ := logged(t)
	bundle := filepath.Join(dir, filepath.FromSlash(audit.EntryBundlePath(0, 10)))
	b, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bundle, bytes.Replace(b, []byte("not in the job"), []byte("NOT in the job"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	ver, err := audit.Verify(context.Background(), dir, keys, nil, nil)
	if err != nil || ver.OK() {
		t.Fatalf("a tampered export verified: %v", err)
	}
	recs, _ := audit.ExportRecords(dir, ver.TreeSize)
	page := render(t, ver, recs)
	if !strings.Contains(page, `<strong id="verdict">NOT VERIFIED</strong>`) || !strings.Contains(page, "modified_entry") {
		t.Fatalf("the page does not lead with the failure")
	}
}

// In a real headless browser (Debian's chromium): the page renders, its
// DOM holds one bar per grant of the job and the verdict, a screenshot is
// taken, and the console shows no error.
func TestReportInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed (scripts/deps.sh installs it): the report must be checked in a real browser")
	}
	_, _, ver, recs := logged(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := os.WriteFile(page, []byte(render(t, ver, recs)), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--user-data-dir=" + filepath.Join(dir, "profile"),
		"--enable-logging=stderr", "--v=0", "--window-size=1400,900"}
	run := func(extra ...string) (string, string) {
		cmd := exec.Command(browser, append(args, append(extra, "file://"+page)...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v\n%s", extra, err, errOut.String())
		}
		return out.String(), errOut.String()
	}
	dom, logs := run("--dump-dom")
	if n := strings.Count(dom, `data-grant="`); n != 3 {
		t.Errorf("the rendered DOM holds %d grant bars, want 3", n)
	}
	if !strings.Contains(dom, `id="verdict">Verified<`) {
		t.Error("the rendered DOM lacks the verdict")
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "CONSOLE") || strings.Contains(l, "Uncaught") {
			t.Errorf("console: %s", l)
		}
	}
	shot := filepath.Join(dir, "report.png")
	run("--screenshot=" + shot)
	st, err := os.Stat(shot)
	if err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v (size %d)", shot, err, st.Size())
	}
	t.Logf("screenshot: %s (%d bytes)", shot, st.Size())
	if keep := os.Getenv("NVMEGATE_REPORT_SCREENSHOT"); keep != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(keep, b, 0o644)
	}
}
