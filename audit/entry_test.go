package audit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/audit"
)

// TestEntryGolden pins the encoding of one entry: any change to it is a
// schema change (bump SchemaVersion).
func TestEntryGolden(t *testing.T) {
	e := audit.Entry{
		Time:         time.Date(2026, 12, 1, 9, 30, 0, 123456789, time.UTC),
		Kind:         audit.EventGrant,
		JobID:        "job-42",
		Tenant:       "acme",
		Caller:       "spiffe://example.org/node/gpu-1",
		HostNQN:      "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
		SubsystemNQN: "nqn.2026-01.io.nvmegate:ds1",
		Namespaces:   []audit.Namespace{{SubsystemNQN: "nqn.2026-01.io.nvmegate:ds1", NSID: 1, Mode: "ro", Dataset: "imagenet", DatasetDigest: "sha256:00"}},
		Decision:     &audit.Decision{Allow: true, ID: "d-1", PolicyRevision: "r7", Reasons: []string{"ok \"quoted\"\n"}},
		Keys:         []audit.KeyRef{{Class: "access_root", ID: "nqn.2026-01.io.nvmegate:ds1", Version: 3, Fingerprint: "hmac-sha256:ab"}},
		GrantID:      "g-1",
		ExpiresAt:    time.Date(2026, 12, 1, 10, 30, 0, 0, time.FixedZone("x", 3600)),
		Detail:       "<&>",
	}
	got, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"caller":"spiffe://example.org/node/gpu-1","decision":{"allow":true,"id":"d-1","policy_revision":"r7","reasons":["ok \"quoted\"\n"]},"detail":"<&>","expires_at":"2026-12-01T09:30:00.000000000Z","grant_id":"g-1","host_nqn":"nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427","job_id":"job-42","keys":[{"class":"access_root","fingerprint":"hmac-sha256:ab","id":"nqn.2026-01.io.nvmegate:ds1","version":3}],"kind":"grant","namespaces":[{"dataset":"imagenet","dataset_digest":"sha256:00","mode":"ro","nsid":1,"subsystem_nqn":"nqn.2026-01.io.nvmegate:ds1"}],"subsystem_nqn":"nqn.2026-01.io.nvmegate:ds1","tenant":"acme","time":"2026-12-01T09:30:00.123456789Z","v":1}`
	if string(got) != want {
		t.Fatalf("encoding changed:\n got %s\nwant %s", got, want)
	}
	// Keys sorted, no whitespace: what a generic JSON canonicalizer makes
	// of it (encoding/json sorts map keys).
	var m any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(m)
	if strings.TrimSuffix(buf.String(), "\n") != want {
		t.Fatalf("not canonical JSON:\n%s", buf.String())
	}
	d, err := audit.DecodeEntry(got)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := d.Encode()
	if !bytes.Equal(again, got) {
		t.Fatal("decode/encode does not round-trip")
	}
}

// TestInvalidArgumentEntryGolden pins an invalid_argument entry as the
// gateway writes it (gateway/testdata/audit-invalid.golden has the details
// of every RPC's): a kind added after schema version 1 without changing the
// encoding, which Append accepts and every decoder reads.
func TestInvalidArgumentEntryGolden(t *testing.T) {
	e := audit.Entry{
		Time:   time.Date(2026, 12, 1, 9, 30, 0, 5, time.UTC),
		Kind:   audit.EventInvalid,
		Caller: "spiffe://example.org/node/gpu-1",
		Detail: `/nvmegate.v1.Access/Renew: invalid argument: grant_id: must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-' (got "…")`,
	}
	got, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"caller":"spiffe://example.org/node/gpu-1","detail":"/nvmegate.v1.Access/Renew: invalid argument: grant_id: must be 8-64 characters of A-Z, a-z, 0-9, '_' and '-' (got \"…\")","kind":"invalid_argument","time":"2026-12-01T09:30:00.000000005Z","v":1}`
	if string(got) != want {
		t.Fatalf("encoding changed:\n got %s\nwant %s", got, want)
	}
	d, err := audit.DecodeEntry(got)
	if err != nil || d.Kind != audit.EventInvalid {
		t.Fatalf("decode: %+v %v", d, err)
	}
	l, _ := newLog(t)
	if _, _, err := l.Append(context.Background(), e); err != nil {
		t.Fatalf("Append refuses the kind: %v", err)
	}
}

func TestDecodeEntryRejectsNonCanonical(t *testing.T) {
	e := sampleEntry(1)
	e.Time = time.Date(2026, 12, 1, 9, 0, 0, 1_000_000, time.UTC)
	good, _ := e.Encode()
	s := string(good)
	for name, bad := range map[string]string{
		"whitespace":       strings.Replace(s, `"kind":`, `"kind": `, 1),
		"key order":        strings.Replace(strings.Replace(s, `"tenant":"tenant-1",`, ``, 1), `{"caller"`, `{"tenant":"tenant-1","caller"`, 1),
		"duplicate key":    strings.Replace(s, `"v":1}`, `"v":1,"v":1}`, 1),
		"unknown key":      strings.Replace(s, `"v":1}`, `"v":1,"x":1}`, 1),
		"schema version":   strings.Replace(s, `"v":1}`, `"v":2}`, 1),
		"leading zero":     strings.Replace(s, `"v":1}`, `"v":01}`, 1),
		"escape":           strings.Replace(s, `job-1`, `job\u002d1`, 1),
		"slash escape":     strings.Replace(s, `spiffe://`, `spiffe:\/\/`, 1),
		"time format":      strings.Replace(s, `.001000000Z`, `.001Z`, 1),
		"empty optional":   strings.Replace(s, `"grant_id":"grant-1",`, `"grant_id":"",`, 1),
		"trailing":         s + " ",
		"missing kind":     strings.Replace(s, `"kind":"grant",`, ``, 1),
		"empty namespaces": strings.Replace(s, `"kind":"grant",`, `"kind":"grant","namespaces":[],`, 1)[:0] + `{"kind":"grant","namespaces":[],"time":"2026-12-01T09:00:00.000000000Z","v":1}`,
	} {
		if _, err := audit.DecodeEntry([]byte(bad)); !errors.Is(err, audit.ErrMalformedEntry) {
			t.Errorf("%s: accepted %s (%v)", name, bad, err)
		}
	}
}
