package compliance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

// PredicateType is the URI of nvmegate's compliance predicate.
const PredicateType = "https://nvmegate.dev/attestation/compliance/v1"

// Predicate is the fabric's state as the attestation states it.
type Predicate struct {
	Time           time.Time `json:"time"`
	PolicyRevision string    `json:"policy_revision"`
	// DataRevision is the store revision the records were read at (0: it
	// moved while they were read).
	DataRevision uint64   `json:"data_revision"`
	Tenants      []Tenant `json:"tenants"`
	Grants       []Grant  `json:"grants"`
	// OutOfCompliance names everything that is not as the policy serving
	// requires, one line each; empty when the fabric complies.
	OutOfCompliance []string     `json:"out_of_compliance"`
	Log             audit.Anchor `json:"log"`
}

// Tenant is one tenant's namespaces.
type Tenant struct {
	Name       string      `json:"name"`
	Namespaces []Namespace `json:"namespaces"`
}

// Namespace is one namespace's placement and keys.
type Namespace struct {
	SubsystemNQN  string `json:"subsystem_nqn"`
	NSID          uint32 `json:"nsid"`
	Region        string `json:"region"`
	DataClass     string `json:"data_class"`
	Dataset       string `json:"dataset,omitempty"`
	DatasetDigest string `json:"dataset_digest,omitempty"`
	Target        string `json:"target"`
	TargetRegion  string `json:"target_region"`
	Fabric        string `json:"fabric"`
	// Residency: the policy's verdict on the placement (its geo-fence).
	Residency Verdict `json:"residency"`
	// RotateEvery is the rotation period the class declares ("" none).
	RotateEvery string `json:"rotate_every,omitempty"`
	AccessRoot  KeyAge `json:"access_root"`
	KEK         KeyAge `json:"kek"`
	AtRest      AtRest `json:"at_rest"`
}

// AtRest says whether nvmegate encrypts a namespace at rest, and how old
// its data key is: the key the data is encrypted under, unchanged by KEK
// rotations (which rewrap it), so its age is that of the KEK's first
// version.
type AtRest struct {
	// Encrypted: the target agent exports the namespace through dm-crypt
	// keyed with the data key. False: the operator's namespace, whose
	// encryption nvmegate cannot vouch for.
	Encrypted     bool   `json:"encrypted"`
	Cipher        string `json:"cipher,omitempty"`
	BackingDevice string `json:"backing_device,omitempty"`
	// DataKey: its Version is the data key's generation (one more at each
	// re-encryption), its age that of the generation, and WithinPeriod
	// judged against ReencryptEvery.
	DataKey KeyAge `json:"data_key"`
	// ReencryptEvery is the data-key age the class allows ("" none).
	ReencryptEvery string `json:"reencrypt_every,omitempty"`
}

// Verdict is a check's outcome.
type Verdict struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
}

// KeyAge is one key's current version and its age against the class's
// rotation period.
type KeyAge struct {
	Name       string    `json:"name"`
	Version    uint64    `json:"version"`
	CreatedAt  time.Time `json:"created_at,omitzero"`
	AgeSeconds int64     `json:"age_seconds"`
	// WithinPeriod: no period declared, or the key is younger than it.
	WithinPeriod bool `json:"within_period"`
}

// Grant is one active grant and the verdict of deciding it again.
type Grant struct {
	ID           string `json:"id"`
	Job          string `json:"job"`
	Tenant       string `json:"tenant"`
	Node         string `json:"node"`
	SubsystemNQN string `json:"subsystem_nqn"`
	// Verdict: "allowed", "revoke" (no longer allowed) or "must_renew"
	// (allowed under obligations it was not issued under).
	Verdict   string    `json:"verdict"`
	Reasons   []string  `json:"reasons,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
	ReauthBy  time.Time `json:"reauth_by,omitzero"`
}

// Statement makes p's statement: its subject is the anchored log state.
func Statement(p *Predicate, cp audit.Checkpoint) (*intoto.Statement, error) {
	p.Log = audit.AnchorOf(cp)
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	pred := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, pred); err != nil {
		return nil, err
	}
	st := &intoto.Statement{Type: intoto.StatementTypeUri, PredicateType: PredicateType, Predicate: pred,
		Subject: []*intoto.ResourceDescriptor{{Name: fmt.Sprintf("%s@%d", cp.Origin, cp.Size), Digest: map[string]string{"sha256": hex.EncodeToString(cp.Hash[:])}}}}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("compliance: %w", err)
	}
	return st, nil
}

// Digest is what the log's entry of an attestation names: "sha256:" and
// the hex SHA-256 of the envelope's JSON, compacted (a bundle re-indents
// the envelope it carries; its meaning, and the signature, do not change).
func Digest(envelope []byte) string {
	var c bytes.Buffer
	if err := json.Compact(&c, envelope); err != nil {
		c.Reset()
		c.Write(envelope) // not JSON: Verify refuses it before this matters
	}
	d := sha256.Sum256(c.Bytes())
	return "sha256:" + hex.EncodeToString(d[:])
}

// Bundle is an attestation with the proof that the log recorded it.
type Bundle struct {
	Envelope json.RawMessage `json:"envelope"` // the DSSE envelope
	// Entry is the log's entry of the attestation (canonical bytes,
	// base64) at Index, proved (Proof, base64 hashes) under Checkpoint, a
	// signed note of a tree that contains the anchor's (Consistency, the
	// proof from the anchor's size to it).
	Index       uint64   `json:"index"`
	Entry       string   `json:"entry"`
	Proof       []string `json:"proof"`
	Checkpoint  string   `json:"checkpoint"`
	Consistency []string `json:"consistency"`
}

// Log is what Record uses of the audit log.
type Log interface {
	Append(ctx context.Context, e audit.Entry) (uint64, [32]byte, error)
	Checkpoint(ctx context.Context) (audit.Checkpoint, error)
	InclusionProof(ctx context.Context, index, treeSize uint64) ([][]byte, error)
	ConsistencyProof(ctx context.Context, from, to uint64) ([][]byte, error)
	Query(ctx context.Context, f audit.Filter, p audit.Page) ([]audit.Record, string, error)
}

// Record signs st with s, appends its digest to log (caller: the entry's
// caller) and returns the bundle, proved under a checkpoint signed after
// the append.
func Record(ctx context.Context, log Log, st *intoto.Statement, s attest.Signer, anchor uint64, caller string) (*Bundle, error) {
	env, err := attest.SignStatement(ctx, st, s)
	if err != nil {
		return nil, err
	}
	at := time.Now().UTC()
	idx, _, err := log.Append(ctx, audit.Entry{Time: at, Kind: audit.EventComplianceAttestation, Caller: caller, Detail: Digest(env)})
	if err != nil {
		return nil, fmt.Errorf("compliance: the attestation's entry was not appended: %w", err)
	}
	cp, err := log.Checkpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("compliance: checkpoint: %w", err)
	}
	recs, _, err := log.Query(ctx, audit.Filter{Kinds: []audit.EventKind{audit.EventComplianceAttestation}, Since: at, Until: at.Add(time.Nanosecond)}, audit.Page{Size: audit.MaxPageSize})
	if err != nil {
		return nil, err
	}
	var raw []byte
	for _, r := range recs {
		if r.Index == idx {
			raw = r.Raw
		}
	}
	if raw == nil {
		return nil, fmt.Errorf("compliance: entry %d not found in the log", idx)
	}
	inc, err := log.InclusionProof(ctx, idx, cp.Size)
	if err != nil {
		return nil, err
	}
	cons, err := log.ConsistencyProof(ctx, anchor, cp.Size)
	if err != nil {
		return nil, err
	}
	return &Bundle{Envelope: env, Index: idx, Entry: base64.StdEncoding.EncodeToString(raw), Proof: b64(inc),
		Checkpoint: string(cp.Note), Consistency: b64(cons)}, nil
}

func b64(hs [][]byte) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h)
	}
	return out
}

func unb64(hs []string) ([][]byte, error) {
	out := make([][]byte, len(hs))
	for i, h := range hs {
		b, err := base64.StdEncoding.DecodeString(h)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

// Report is what Verify found.
type Report struct {
	Time            time.Time `json:"time"`
	PolicyRevision  string    `json:"policy_revision"`
	Namespaces      int       `json:"namespaces"`
	Grants          int       `json:"grants"`
	OutOfCompliance []string  `json:"out_of_compliance"`
	AnchorSize      uint64    `json:"anchor_tree_size"`
	RecordedAt      uint64    `json:"recorded_at_index"`
	TreeSize        uint64    `json:"tree_size"`
	SignedBy        string    `json:"signed_by"`
	Predicate       Predicate `json:"-"`
}

// Verify checks a bundle offline against the log's public keys: the
// envelope's signature, the anchor checkpoint's signature and that the
// statement's subject is it, the later checkpoint's signature and its
// consistency with the anchor, and that the log holds, at Index, the
// attestation's entry naming the envelope's digest. Any failure is an
// error naming it.
func Verify(bundleJSON []byte, keys []attest.PublicKey) (*Report, error) {
	var b Bundle
	if err := json.Unmarshal(bundleJSON, &b); err != nil {
		return nil, fmt.Errorf("compliance: not a compliance bundle: %w", err)
	}
	var p Predicate
	st, signer, err := attest.OpenPredicate(b.Envelope, PredicateType, keys, &p)
	if err != nil {
		return nil, fmt.Errorf("compliance: %w", err)
	}
	anchor, err := p.Log.Open(keys)
	if err != nil {
		return nil, fmt.Errorf("compliance: anchor checkpoint: %w", err)
	}
	if len(st.Subject) != 1 || st.Subject[0].Digest["sha256"] != hex.EncodeToString(anchor.Hash[:]) {
		return nil, fmt.Errorf("compliance: the subject is not the anchor checkpoint's root")
	}
	later, _, err := audit.OpenCheckpoint([]byte(b.Checkpoint), keys)
	if err != nil {
		return nil, fmt.Errorf("compliance: checkpoint: %w", err)
	}
	if later.Origin != anchor.Origin || later.Size <= b.Index || later.Size < anchor.Size {
		return nil, fmt.Errorf("compliance: checkpoint of %s size %d cannot prove entry %d after the anchor's size %d", later.Origin, later.Size, b.Index, anchor.Size)
	}
	cons, err := unb64(b.Consistency)
	if err != nil {
		return nil, fmt.Errorf("compliance: consistency proof: %w", err)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, anchor.Size, later.Size, cons, anchor.Hash[:], later.Hash[:]); err != nil {
		return nil, fmt.Errorf("compliance: the log at the anchor is not a prefix of the log that recorded the attestation: %w", err)
	}
	entry, err := base64.StdEncoding.DecodeString(b.Entry)
	if err != nil {
		return nil, fmt.Errorf("compliance: entry: %w", err)
	}
	inc, err := unb64(b.Proof)
	if err != nil {
		return nil, fmt.Errorf("compliance: inclusion proof: %w", err)
	}
	leaf := audit.LeafHash(entry)
	if err := proof.VerifyInclusion(rfc6962.DefaultHasher, b.Index, later.Size, leaf[:], inc, later.Hash[:]); err != nil {
		return nil, fmt.Errorf("compliance: the attestation's entry is not in the signed log: %w", err)
	}
	e, err := audit.DecodeEntry(entry)
	if err != nil {
		return nil, fmt.Errorf("compliance: entry: %w", err)
	}
	if e.Kind != audit.EventComplianceAttestation || e.Detail != Digest(b.Envelope) {
		return nil, fmt.Errorf("compliance: entry %d (%s) does not record this attestation", b.Index, e.Kind)
	}
	if b.Index < anchor.Size {
		return nil, fmt.Errorf("compliance: entry %d is inside the anchor (size %d): recorded before it was made", b.Index, anchor.Size)
	}
	n := 0
	for _, t := range p.Tenants {
		n += len(t.Namespaces)
	}
	return &Report{Time: p.Time, PolicyRevision: p.PolicyRevision, Namespaces: n, Grants: len(p.Grants), OutOfCompliance: p.OutOfCompliance,
		AnchorSize: anchor.Size, RecordedAt: b.Index, TreeSize: later.Size, SignedBy: signer.KeyID(), Predicate: p}, nil
}
