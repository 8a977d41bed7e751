package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nvmegate/nvmegate"
)

// SchemaVersion is the newest version of the entry encoding, written as
// "v" in every entry: 2 in an entry that carries a change (Entry.Change),
// 1 in every other, whose encoding version 2 left as it was. A decoder
// refuses other versions, a change in a version 1 entry and a version 2
// entry without one: each entry has one encoding.
const SchemaVersion = 2

// schemaV1 is the version of an entry without a change.
const schemaV1 = 1

// MaxEntrySize bounds an encoded entry: C2SP tlog-tiles entry bundles
// prefix each entry with a 16-bit length.
const MaxEntrySize = 65535

// maxField bounds any one string field, so that a runaway reason list or
// detail cannot push an entry past MaxEntrySize unnoticed.
const maxField = 4096

// EventKind says what an entry records.
type EventKind string

// Event kinds. Append refuses others; a decoder accepts any lower-case
// identifier so that an older verifier can still check a newer log.
const (
	EventGrant           EventKind = "grant"            // credentials issued for a connect
	EventDeny            EventKind = "deny"             // a request refused (policy, a target, another's grant)
	EventInvalid         EventKind = "invalid_argument" // a malformed request refused before policy (InvalidArgument)
	EventRenew           EventKind = "renew"            // a grant renewed
	EventRelease         EventKind = "release"          // a grant released by its holder
	EventExpire          EventKind = "expire"           // a grant or job expired
	EventRevoke          EventKind = "revoke"           // an admin revoked a grant or job
	EventJobAdmit        EventKind = "job_admit"        // a job scope admitted
	EventJobFinish       EventKind = "job_finish"       // a job finished
	EventJobNodes        EventKind = "job_nodes"        // a job's nodes changed (an elastic job)
	EventKeyRotation     EventKind = "key_rotation"     // a key version added (access root, DEK, log signing)
	EventInventoryChange EventKind = "inventory_change" // inventory created/deleted
	EventPolicyLoad      EventKind = "policy_load"      // a policy revision loaded
	EventTargetApply     EventKind = "target_apply"     // a target agent acknowledged a generation
	EventReauth          EventKind = "reauth_required"  // a change made a live grant's obligations stronger: it must renew by a deadline
	// EventComplianceAttestation records a compliance attestation: its
	// detail is the digest of the signed envelope.
	EventComplianceAttestation EventKind = "compliance_attestation"
	// EventStateChange records a change of the gateway's state that no
	// other entry of its proposal stands for (a settled removal, a
	// renewal deadline): it carries the change (Entry.Change).
	EventStateChange EventKind = "state_change"
	// EventStateSnapshot records a whole state the log's changes start
	// from (a genesis): it carries the snapshot as its change.
	EventStateSnapshot EventKind = "state_snapshot"
)

var knownKinds = map[EventKind]bool{
	EventGrant: true, EventDeny: true, EventRenew: true, EventRelease: true,
	EventExpire: true, EventRevoke: true, EventJobAdmit: true, EventJobFinish: true, EventJobNodes: true,
	EventKeyRotation: true, EventInventoryChange: true, EventPolicyLoad: true,
	EventTargetApply: true, EventInvalid: true, EventReauth: true, EventComplianceAttestation: true,
	EventStateChange: true, EventStateSnapshot: true,
}

// Entry is one audit record: a decision or a state change. See doc.go for
// the encoding. Entries carry key versions and fingerprints (keyed hashes),
// NEVER key material; Append refuses an entry any of whose strings looks
// like an NVMe secret or a PEM private key (ErrKeyMaterial).
type Entry struct {
	Time         time.Time   // when it happened; Append sets it from Options.Now if zero
	Kind         EventKind   // what happened
	JobID        string      // the training job, if any
	Tenant       string      // the tenant
	Caller       string      // SPIFFE ID of the caller
	HostNQN      string      // host NQN of a connect/grant
	SubsystemNQN string      // subsystem of a connect/grant
	Namespaces   []Namespace // namespaces concerned, with modes and datasets
	Decision     *Decision   // the policy decision, if one was made
	Keys         []KeyRef    // key versions and fingerprints involved
	GrantID      string      // the grant (lease), if any
	ExpiresAt    time.Time   // expiry of the grant or job, if any
	Detail       string      // free text (no secrets): why a step failed, what changed
	// Change, if set, is the state change recorded with the entry: its
	// payload sits beside the entry in the log, and the entry (so the
	// leaf) commits to its digest. Set by the log when it sequences a
	// proposal (Log.Propose), never by callers of Append.
	Change *ChangeRef
}

// ChangeRef names a state change by its revision in the store's order and
// the SHA-256 digest of its payload ("sha256:" and 64 hex digits).
type ChangeRef struct {
	Revision uint64
	Digest   string
}

// Namespace is one namespace an entry concerns.
type Namespace struct {
	SubsystemNQN  string
	NSID          uint32
	Mode          string // "ro", "rw" or "" (not an access)
	Dataset       string // dataset name, if known
	DatasetDigest string // dataset digest ("sha256:…"), if known
}

// Decision is the part of a policy decision an auditor needs.
type Decision struct {
	Allow          bool
	ID             string
	PolicyRevision string
	Reasons        []string
}

// KeyRef names one key version used by the recorded action, never its
// material.
type KeyRef struct {
	Class       string // "access_root", "dek", "log_signing", …
	ID          string // the key's name (e.g. the subsystem NQN it is the root of)
	Version     uint64
	Fingerprint string // a keyed hash of the key, e.g. "hmac-sha256:…"
}

// LeafHash returns the RFC 6962 leaf hash of encoded entry bytes:
// SHA-256(0x00 || data).
func LeafHash(data []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write(data)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// timeLayout is the only time format of the encoding: UTC, nanoseconds,
// fixed width, so that each instant has one encoding.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// maxJSONInt is the largest integer every JSON reader represents exactly.
const maxJSONInt = 1<<53 - 1

// Validate checks what Append requires beyond the encoding: a known kind,
// a time, and identifiers without control characters. Key material is
// checked in Encode, which sees every string.
func (e *Entry) Validate() error {
	if !knownKinds[e.Kind] {
		return fmt.Errorf("%w: kind %q", ErrInvalidEntry, e.Kind)
	}
	if e.Time.IsZero() {
		return fmt.Errorf("%w: time is zero", ErrInvalidEntry)
	}
	check := func(name, v string) error {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < 0x20 || c == 0x7f {
				return fmt.Errorf("%w: %s contains a control character", ErrInvalidEntry, name)
			}
		}
		return nil
	}
	var err error
	set := func(e error) {
		if err == nil {
			err = e
		}
	}
	set(check("job_id", e.JobID))
	set(check("tenant", e.Tenant))
	set(check("caller", e.Caller))
	set(check("host_nqn", e.HostNQN))
	set(check("subsystem_nqn", e.SubsystemNQN))
	set(check("grant_id", e.GrantID))
	if c := e.Change; c != nil && !validDigest(c.Digest) {
		set(fmt.Errorf("%w: change.digest is not sha256: and 64 lower-case hex digits", ErrInvalidEntry))
	}
	if d := e.Decision; d != nil {
		set(check("decision.id", d.ID))
		set(check("decision.policy_revision", d.PolicyRevision))
	}
	for i := range e.Namespaces {
		n := &e.Namespaces[i]
		set(check("namespaces.subsystem_nqn", n.SubsystemNQN))
		set(check("namespaces.mode", n.Mode))
		set(check("namespaces.dataset", n.Dataset))
		set(check("namespaces.dataset_digest", n.DatasetDigest))
	}
	for i := range e.Keys {
		k := &e.Keys[i]
		if k.Version > maxJSONInt {
			set(fmt.Errorf("%w: keys.version too large", ErrInvalidEntry))
		}
		set(check("keys.class", k.Class))
		set(check("keys.id", k.ID))
		set(check("keys.fingerprint", k.Fingerprint))
	}
	return err
}

// Encode returns the canonical encoding of e (see doc.go): JSON with the
// keys of every object in sorted order, no insignificant whitespace, RFC
// 8785 string escaping, fixed-width UTC times, optional top-level fields
// omitted when empty. It fails on invalid UTF-8, oversized fields, key
// material (ErrKeyMaterial) and an encoding over MaxEntrySize.
func (e *Entry) Encode() ([]byte, error) {
	return e.appendTo(make([]byte, 0, 512))
}

func (e *Entry) appendTo(b []byte) ([]byte, error) {
	w := encoder{b: b}
	w.raw(`{`)
	w.optString("caller", e.Caller)
	version := schemaV1
	if c := e.Change; c != nil {
		version = SchemaVersion
		w.key("change")
		w.raw(`{"digest":`)
		w.str("change.digest", c.Digest)
		w.raw(`,"revision":`)
		w.uint("change.revision", c.Revision)
		w.raw(`}`)
	}
	if d := e.Decision; d != nil {
		w.key("decision")
		w.raw(`{"allow":`)
		w.raw(strconv.FormatBool(d.Allow))
		w.raw(`,"id":`)
		w.str("decision.id", d.ID)
		w.raw(`,"policy_revision":`)
		w.str("decision.policy_revision", d.PolicyRevision)
		w.raw(`,"reasons":[`)
		for i, r := range d.Reasons {
			if i > 0 {
				w.raw(`,`)
			}
			w.str("decision.reasons", r)
		}
		w.raw(`]}`)
	}
	w.optString("detail", e.Detail)
	if !e.ExpiresAt.IsZero() {
		w.key("expires_at")
		w.time("expires_at", e.ExpiresAt)
	}
	w.optString("grant_id", e.GrantID)
	w.optString("host_nqn", e.HostNQN)
	w.optString("job_id", e.JobID)
	if len(e.Keys) > 0 {
		w.key("keys")
		w.raw(`[`)
		for i, k := range e.Keys {
			if i > 0 {
				w.raw(`,`)
			}
			w.raw(`{"class":`)
			w.str("keys.class", k.Class)
			w.raw(`,"fingerprint":`)
			w.str("keys.fingerprint", k.Fingerprint)
			w.raw(`,"id":`)
			w.str("keys.id", k.ID)
			w.raw(`,"version":`)
			w.uint("keys.version", k.Version)
			w.raw(`}`)
		}
		w.raw(`]`)
	}
	w.key("kind")
	w.str("kind", string(e.Kind))
	if len(e.Namespaces) > 0 {
		w.key("namespaces")
		w.raw(`[`)
		for i, n := range e.Namespaces {
			if i > 0 {
				w.raw(`,`)
			}
			w.raw(`{"dataset":`)
			w.str("namespaces.dataset", n.Dataset)
			w.raw(`,"dataset_digest":`)
			w.str("namespaces.dataset_digest", n.DatasetDigest)
			w.raw(`,"mode":`)
			w.str("namespaces.mode", n.Mode)
			w.raw(`,"nsid":`)
			w.b = strconv.AppendUint(w.b, uint64(n.NSID), 10)
			w.raw(`,"subsystem_nqn":`)
			w.str("namespaces.subsystem_nqn", n.SubsystemNQN)
			w.raw(`}`)
		}
		w.raw(`]`)
	}
	w.optString("subsystem_nqn", e.SubsystemNQN)
	w.optString("tenant", e.Tenant)
	w.key("time")
	w.time("time", e.Time)
	w.raw(`,"v":`)
	w.b = strconv.AppendInt(w.b, int64(version), 10)
	w.raw(`}`)
	if w.err != nil {
		return nil, w.err
	}
	if len(w.b) > MaxEntrySize {
		return nil, fmt.Errorf("%w: encoded entry is %d bytes (max %d)", ErrInvalidEntry, len(w.b), MaxEntrySize)
	}
	return w.b, nil
}

type encoder struct {
	b     []byte
	err   error
	first bool // a member was written to the top-level object
}

func (w *encoder) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *encoder) raw(s string) { w.b = append(w.b, s...) }

// uint writes v in decimal; one past what every JSON reader holds exactly
// fails the entry.
func (w *encoder) uint(field string, v uint64) {
	if v > maxJSONInt {
		w.fail(fmt.Errorf("%w: %s too large", ErrInvalidEntry, field))
	}
	w.b = strconv.AppendUint(w.b, v, 10)
}

// key writes a top-level member name (with its leading comma).
func (w *encoder) key(k string) {
	if w.first {
		w.b = append(w.b, ',')
	}
	w.first = true
	w.b = append(w.b, '"')
	w.b = append(w.b, k...)
	w.b = append(w.b, '"', ':')
}

func (w *encoder) optString(k, v string) {
	if v == "" {
		return
	}
	w.key(k)
	w.str(k, v)
}

func (w *encoder) time(field string, t time.Time) {
	t = t.UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		w.fail(fmt.Errorf("%w: %s year %d out of range", ErrInvalidEntry, field, y))
		return
	}
	w.b = append(w.b, '"')
	w.b = t.AppendFormat(w.b, timeLayout)
	w.b = append(w.b, '"')
}

const hexDigits = "0123456789abcdef"

// str appends s as a JSON string with RFC 8785 escaping: '"' and '\' and
// the control characters are escaped (\b \t \n \f \r, else \u00xx), every
// other character is written as itself in UTF-8.
func (w *encoder) str(field, s string) {
	if len(s) > maxField {
		w.fail(fmt.Errorf("%w: %s is %d bytes (max %d)", ErrInvalidEntry, field, len(s), maxField))
		return
	}
	if !utf8.ValidString(s) {
		w.fail(fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEntry, field))
		return
	}
	if nvmegate.LooksLikeKeyMaterial(s) {
		// Never echo the value.
		w.fail(fmt.Errorf("%w: field %s", ErrKeyMaterial, field))
		return
	}
	w.b = append(w.b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		w.b = append(w.b, s[start:i]...)
		switch c {
		case '"':
			w.b = append(w.b, '\\', '"')
		case '\\':
			w.b = append(w.b, '\\', '\\')
		case '\b':
			w.b = append(w.b, '\\', 'b')
		case '\t':
			w.b = append(w.b, '\\', 't')
		case '\n':
			w.b = append(w.b, '\\', 'n')
		case '\f':
			w.b = append(w.b, '\\', 'f')
		case '\r':
			w.b = append(w.b, '\\', 'r')
		default:
			w.b = append(w.b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	w.b = append(w.b, s[start:]...)
	w.b = append(w.b, '"')
}

// validDigest reports whether s is "sha256:" and 64 lower-case hex digits.
func validDigest(s string) bool {
	const prefix = "sha256:"
	if len(s) != len(prefix)+64 || s[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// PayloadDigest is the digest an entry's ChangeRef gives of payload.
func PayloadDigest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return "sha256:" + hex.EncodeToString(sum[:])
}
