package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/compliance"
)

// complianceBundleMadeAt records, in a log of its own, a compliance
// attestation whose signed time is made, as the gateway would have at
// that time, and writes the bundle and the log's public key (v1.pem) to a
// new directory. A bundle made hours ago and kept is what a replay
// presents.
func complianceBundleMadeAt(t *testing.T, made time.Time) (bundle, key string) {
	t.Helper()
	dir := t.TempDir()
	k, err := attest.GenerateKey(attest.Ed25519, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := attest.NewLocalSigner(k, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: "nvmegate.test/nvmegate-audit", Signer: s})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, _, err := l.Append(ctx, audit.Entry{Kind: audit.EventPolicyLoad, Detail: "r1"}); err != nil {
		t.Fatal(err)
	}
	cp, err := l.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := compliance.Statement(&compliance.Predicate{Time: made.UTC(), PolicyRevision: "r1", OutOfCompliance: []string{}}, cp)
	if err != nil {
		t.Fatal(err)
	}
	b, err := compliance.Record(ctx, l, st, s, cp.Size, "spiffe://nvmegate.test/gateway/gateway")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	pem, err := s.PublicKey().MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	bundle, key = filepath.Join(dir, "compliance.json"), filepath.Join(dir, "v1.pem")
	if err := os.WriteFile(bundle, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem, 0o644); err != nil {
		t.Fatal(err)
	}
	return bundle, key
}

// verifyOffline runs the command tree without a gateway (attest verify needs
// none) and returns what it wrote to stdout and stderr.
func verifyOffline(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	a := newApp(&out, &errOut)
	defer a.close()
	root := a.root()
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// A compliance bundle signed hours ago still verifies cryptographically;
// `attest verify` refuses it when it is older than --max-age (2h unless
// given), saying how old it is and what the bound was, and a fresh one
// passes with its issue time and age on the first line (issue 29: a
// replayed bundle verified "OK").
func TestAttestVerifyRefusesStaleCompliance(t *testing.T) {
	made := time.Now().Add(-3*time.Hour - 12*time.Minute).Truncate(time.Second)
	issued := made.UTC().Format(time.RFC3339)
	stale, key := complianceBundleMadeAt(t, made)

	_, _, err := verifyOffline("attest", "verify", stale, "--key", key, "--max-age", "1h")
	if err == nil {
		t.Fatal("a bundle made 3h12m ago verified with --max-age 1h")
	}
	for _, want := range []string{"verification failed", "issued " + issued, "3h12m ago", "maximum age 1h", "--max-age"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("--max-age 1h: %q lacks %q", err, want)
		}
	}
	// No flag: the default bound, and how to verify an archive.
	_, _, err = verifyOffline("attest", "verify", stale, "--key", key)
	if err == nil || !strings.Contains(err.Error(), "maximum age 2h") || !strings.Contains(err.Error(), "--max-age 0") {
		t.Errorf("default bound: %v", err)
	}
	// A bound it is within.
	out, _, err := verifyOffline("attest", "verify", stale, "--key", key, "--max-age", "4h")
	if err != nil {
		t.Fatalf("--max-age 4h: %v", err)
	}
	if first, _, _ := strings.Cut(out, "\n"); first != "issued:            "+issued+" (3h12m ago)" {
		t.Errorf("first line %q, want the issue time and age:\n%s", first, out)
	}
	if !strings.Contains(out, "within --max-age 4h") || !strings.Contains(out, "result:            OK") {
		t.Errorf("--max-age 4h:\n%s", out)
	}
	// Archived evidence: no bound, the age shown and warned about.
	out, errOut, err := verifyOffline("attest", "verify", stale, "--key", key, "--max-age", "0")
	if err != nil || !strings.HasPrefix(out, "issued:            "+issued+" (3h12m ago)") || !strings.Contains(out, "not bounded") {
		t.Fatalf("--max-age 0: %v\n%s", err, out)
	}
	if !strings.Contains(errOut, "warning") || !strings.Contains(errOut, "3h12m ago") {
		t.Errorf("--max-age 0: no warning of the age on stderr: %q", errOut)
	}

	// A fresh one passes the default and says how old it is.
	fresh, freshKey := complianceBundleMadeAt(t, time.Now().Add(-90*time.Second))
	out, errOut, err = verifyOffline("attest", "verify", fresh, "--key", freshKey)
	if err != nil {
		t.Fatalf("fresh: %v", err)
	}
	if first, _, _ := strings.Cut(out, "\n"); !strings.HasPrefix(first, "issued:            ") || !strings.HasSuffix(first, "s ago)") {
		t.Errorf("fresh: first line %q:\n%s", first, out)
	}
	if !strings.Contains(out, "within --max-age 2h") || errOut != "" {
		t.Errorf("fresh:\n%s\nstderr: %s", out, errOut)
	}
	// JSON states the age too.
	out, _, err = verifyOffline("-o", "json", "attest", "verify", fresh, "--key", freshKey)
	var j struct {
		Time          time.Time `json:"time"`
		AgeSeconds    int64     `json:"age_seconds"`
		MaxAgeSeconds int64     `json:"max_age_seconds"`
	}
	if err != nil || json.Unmarshal([]byte(out), &j) != nil || j.AgeSeconds < 90 || j.AgeSeconds > 600 || j.MaxAgeSeconds != 7200 || j.Time.IsZero() {
		t.Errorf("json: %v %+v\n%s", err, j, out)
	}
}

// --not-before refuses an attestation made before the time given (one a
// verifier knows predates a change it must reflect), however young.
func TestAttestVerifyNotBefore(t *testing.T) {
	made := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	bundle, key := complianceBundleMadeAt(t, made)
	bound := made.Add(5 * time.Minute).UTC().Format(time.RFC3339)
	_, _, err := verifyOffline("attest", "verify", bundle, "--key", key, "--not-before", bound)
	if err == nil {
		t.Fatal("an attestation made before --not-before verified")
	}
	for _, want := range []string{"verification failed", "issued " + made.UTC().Format(time.RFC3339) + " (10m", "ago)", "before the bound " + bound, "--not-before"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	out, _, err := verifyOffline("attest", "verify", bundle, "--key", key, "--not-before", made.Add(-time.Minute).Format(time.RFC3339))
	if err != nil || !strings.Contains(out, "not before ") || !strings.Contains(out, "result:            OK") {
		t.Errorf("made after --not-before: %v\n%s", err, out)
	}
	if _, _, err := verifyOffline("attest", "verify", bundle, "--key", key, "--not-before", "yesterday"); err == nil || !strings.Contains(err.Error(), "RFC 3339") {
		t.Errorf("--not-before yesterday: %v", err)
	}
	if _, _, err := verifyOffline("attest", "verify", bundle, "--key", key, "--max-age", "-1h"); err == nil || !strings.Contains(err.Error(), "--max-age") {
		t.Errorf("--max-age -1h: %v", err)
	}
}
