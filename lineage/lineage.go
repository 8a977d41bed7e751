package lineage

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

// PredicateType is the URI of nvmegate's dataset-access predicate.
const PredicateType = "https://nvmegate.dev/attestation/dataset-access/v1"

// PayloadType is the DSSE payload type of an in-toto statement.
const PayloadType = attest.StatementPayloadType

// Predicate is what the statement says about the job's access.
type Predicate struct {
	Job             JobInfo        `json:"job"`
	Namespaces      []NamespaceUse `json:"namespaces"`
	FirstAccess     time.Time      `json:"first_access,omitzero"`
	LastAccess      time.Time      `json:"last_access,omitzero"`
	PolicyRevisions []string       `json:"policy_revisions"`
	KeyVersions     []audit.KeyRef `json:"key_versions"`
	Log             audit.Anchor   `json:"log"`
	Entries         []LogEntry     `json:"entries"`
}

// JobInfo describes the job.
type JobInfo struct {
	ID         string    `json:"id"`
	Tenant     string    `json:"tenant"`
	Scheduler  string    `json:"scheduler"`
	Nodes      []string  `json:"nodes"`
	State      string    `json:"state"`
	AdmittedAt time.Time `json:"admitted_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	ExpiresAt  time.Time `json:"expires_at"`
	// Generation is the job's run under its ID (a requeued Slurm job's
	// restart count); User whom its scheduler said it runs as.
	Generation uint32 `json:"generation"`
	User       string `json:"user,omitempty"`
}

// NamespaceUse is one namespace of the job scope with its dataset.
type NamespaceUse struct {
	SubsystemNQN  string `json:"subsystem_nqn"`
	NSID          uint32 `json:"nsid"`
	Mode          string `json:"mode"`
	Dataset       string `json:"dataset"`
	DatasetDigest string `json:"dataset_digest"`
}

// LogEntry is one audit entry of the job with its inclusion proof.
type LogEntry struct {
	Index  uint64   `json:"index"`
	Entry  string   `json:"entry"`  // base64 of the canonical entry bytes
	Proof  []string `json:"proof"`  // base64 hashes, leaf to root
	Kind   string   `json:"kind"`   // informational; the entry bytes are authoritative
	Leaf   string   `json:"leaf"`   // hex leaf hash; informational
	Caller string   `json:"caller"` // informational
}

// Log is what Build reads of the audit log.
type Log interface {
	Query(ctx context.Context, f audit.Filter, p audit.Page) ([]audit.Record, string, error)
	Checkpoint(ctx context.Context) (audit.Checkpoint, error)
	InclusionProof(ctx context.Context, index, treeSize uint64) ([][]byte, error)
}

// Build gathers the job's entries from the log, signs a checkpoint
// covering them, and returns the statement. datasets names the dataset of
// each namespace of the job (NamespaceKey → Dataset, DatasetDigest), from
// the inventory.
func Build(ctx context.Context, log Log, j *nvmegate.Job, datasets map[string]NamespaceUse) (*intoto.Statement, error) {
	var recs []audit.Record
	tok := ""
	for {
		page, next, err := log.Query(ctx, audit.Filter{JobID: j.ID}, audit.Page{Size: audit.MaxPageSize, Token: tok})
		if err != nil {
			return nil, err
		}
		recs = append(recs, page...)
		if next == "" {
			break
		}
		tok = next
	}
	cp, err := log.Checkpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("lineage: checkpoint: %w", err)
	}
	p := Predicate{
		Job: JobInfo{ID: j.ID, Tenant: j.Tenant, Scheduler: j.Scheduler, Nodes: j.Nodes, State: j.State,
			AdmittedAt: j.AdmittedAt, FinishedAt: j.FinishedAt, ExpiresAt: j.ExpiresAt, Generation: j.Generation, User: j.User},
		Log: audit.AnchorOf(cp),
	}
	for _, jn := range j.Namespaces {
		u := datasets[NamespaceKey(jn.SubsystemNQN, jn.NSID)]
		u.SubsystemNQN, u.NSID, u.Mode = jn.SubsystemNQN, jn.NSID, jn.Mode
		p.Namespaces = append(p.Namespaces, u)
	}
	recs = fromGeneration(recs, j)
	revs := map[string]bool{}
	keys := map[string]audit.KeyRef{}
	for _, r := range recs {
		if r.Index >= cp.Size {
			continue // after the checkpoint: not provable yet
		}
		hashes, err := log.InclusionProof(ctx, r.Index, cp.Size)
		if err != nil {
			return nil, fmt.Errorf("lineage: proof of entry %d: %w", r.Index, err)
		}
		e := LogEntry{Index: r.Index, Entry: base64.StdEncoding.EncodeToString(r.Raw), Kind: string(r.Entry.Kind),
			Leaf: hex.EncodeToString(r.LeafHash[:]), Caller: r.Entry.Caller}
		for _, h := range hashes {
			e.Proof = append(e.Proof, base64.StdEncoding.EncodeToString(h))
		}
		p.Entries = append(p.Entries, e)
		if d := r.Entry.Decision; d != nil && d.PolicyRevision != "" {
			revs[d.PolicyRevision] = true
		}
		for _, k := range r.Entry.Keys {
			keys[fmt.Sprintf("%s/%s/%d/%s", k.Class, k.ID, k.Version, k.Fingerprint)] = k
		}
		if r.Entry.Kind == audit.EventGrant || r.Entry.Kind == audit.EventRenew {
			if p.FirstAccess.IsZero() || r.Entry.Time.Before(p.FirstAccess) {
				p.FirstAccess = r.Entry.Time
			}
			if r.Entry.Time.After(p.LastAccess) {
				p.LastAccess = r.Entry.Time
			}
		}
	}
	p.PolicyRevisions = slices.Sorted(func(y func(string) bool) {
		for r := range revs {
			if !y(r) {
				return
			}
		}
	})
	for _, k := range slices.Sorted(func(y func(string) bool) {
		for k := range keys {
			if !y(k) {
				return
			}
		}
	}) {
		p.KeyVersions = append(p.KeyVersions, keys[k])
	}
	pred, err := toStruct(p)
	if err != nil {
		return nil, err
	}
	st := &intoto.Statement{Type: intoto.StatementTypeUri, PredicateType: PredicateType, Predicate: pred}
	seen := map[string]bool{}
	for _, u := range p.Namespaces {
		name := u.Dataset
		if name == "" || seen[name+u.DatasetDigest] {
			continue
		}
		seen[name+u.DatasetDigest] = true
		hexDigest, ok := strings.CutPrefix(u.DatasetDigest, "sha256:")
		if !ok {
			return nil, fmt.Errorf("lineage: dataset %s has no sha256 digest", name)
		}
		st.Subject = append(st.Subject, &intoto.ResourceDescriptor{Name: name, Digest: map[string]string{"sha256": hexDigest}})
	}
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("lineage: %w", err)
	}
	return st, nil
}

// fromGeneration keeps the records of j's run: of j's tenant (another
// tenant's scheduler naming the same job ID is refused, but its calls are
// recorded under the ID too), from the run's admission on (the gateway
// records a generation past 0 as "jobs.admit ID generation N"; an
// attempt the store refused is followed by its "... failed" entry and is
// no start). A requeued job's earlier runs are in the log before it; each
// run's entries are apart because a run starts only once the one before
// has ended.
func fromGeneration(recs []audit.Record, j *nvmegate.Job) []audit.Record {
	recs = slices.DeleteFunc(recs, func(r audit.Record) bool { return r.Entry.Tenant != "" && r.Entry.Tenant != j.Tenant })
	if j.Generation == 0 {
		return recs
	}
	want := fmt.Sprintf("jobs.admit %s generation %d", j.ID, j.Generation)
	for i, r := range recs {
		if r.Entry.Kind != audit.EventJobAdmit || r.Entry.Detail != want || r.Entry.Decision == nil || !r.Entry.Decision.Allow {
			continue
		}
		failed := false
		for _, q := range recs[i+1:] {
			if q.Entry.Caller == r.Entry.Caller && strings.HasPrefix(q.Entry.Detail, want) {
				failed = strings.HasPrefix(q.Entry.Detail, want+" failed")
				break
			}
		}
		if !failed {
			return recs[i:]
		}
	}
	return recs
}

func toStruct(v any) (*structpb.Struct, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	s := &structpb.Struct{}
	return s, protojson.Unmarshal(raw, s)
}

// Sign wraps the statement in a DSSE envelope signed by s and returns the
// envelope's JSON.
func Sign(ctx context.Context, st *intoto.Statement, s attest.Signer) ([]byte, error) {
	return attest.SignStatement(ctx, st, s)
}

// Report is what Verify found.
type Report struct {
	Job        string   `json:"job"`
	Generation uint32   `json:"generation"`
	User       string   `json:"user,omitempty"`
	Nodes      []string `json:"nodes"`
	Tenant     string   `json:"tenant"`
	Datasets   []string `json:"datasets"`
	Entries    int      `json:"entries_verified"`
	TreeSize   uint64   `json:"tree_size"`
	SignedBy   string   `json:"signed_by"`
}

// Verify checks an envelope offline against the log's public keys and
// returns what it attests; any failure is an error naming it.
func Verify(envJSON []byte, keys []attest.PublicKey) (*Report, error) {
	var p Predicate
	st, signer, err := attest.OpenPredicate(envJSON, PredicateType, keys, &p)
	if err != nil {
		return nil, fmt.Errorf("lineage: %w", err)
	}
	cp, err := p.Log.Open(keys)
	if err != nil {
		return nil, fmt.Errorf("lineage: checkpoint: %w", err)
	}
	named := map[string]bool{}
	for _, e := range p.Entries {
		data, err := base64.StdEncoding.DecodeString(e.Entry)
		if err != nil {
			return nil, fmt.Errorf("lineage: entry %d: %w", e.Index, err)
		}
		leaf := audit.LeafHash(data)
		var hashes [][]byte
		for _, h := range e.Proof {
			b, err := base64.StdEncoding.DecodeString(h)
			if err != nil {
				return nil, fmt.Errorf("lineage: entry %d proof: %w", e.Index, err)
			}
			hashes = append(hashes, b)
		}
		if err := proof.VerifyInclusion(rfc6962.DefaultHasher, e.Index, cp.Size, leaf[:], hashes, cp.Hash[:]); err != nil {
			return nil, fmt.Errorf("lineage: entry %d is not in the signed log: %w", e.Index, err)
		}
		dec, err := audit.DecodeEntry(data)
		if err != nil {
			return nil, fmt.Errorf("lineage: entry %d: %w", e.Index, err)
		}
		if dec.JobID != p.Job.ID {
			return nil, fmt.Errorf("lineage: entry %d belongs to job %q, not %q", e.Index, dec.JobID, p.Job.ID)
		}
		for _, n := range dec.Namespaces {
			if n.Dataset != "" {
				named[n.Dataset+"@"+n.DatasetDigest] = true
			}
		}
	}
	rep := &Report{Job: p.Job.ID, Generation: p.Job.Generation, User: p.Job.User, Nodes: p.Job.Nodes, Tenant: p.Job.Tenant,
		Entries: len(p.Entries), TreeSize: cp.Size, SignedBy: signer.KeyID()}
	for _, s := range st.Subject {
		d := "sha256:" + s.Digest["sha256"]
		if len(p.Entries) > 0 && !named[s.Name+"@"+d] {
			return nil, fmt.Errorf("lineage: subject %s (%s) is named by none of the job's entries", s.Name, d)
		}
		rep.Datasets = append(rep.Datasets, s.Name+"@"+d)
	}
	return rep, nil
}

// NamespaceKey keys the datasets map of Build.
func NamespaceKey(subsystemNQN string, nsid uint32) string {
	return fmt.Sprintf("%s/%d", subsystemNQN, nsid)
}
