package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/lineage"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// AuditLog is the audit log as the gateway uses it (*audit.Log): the
// interceptors append, the Audit service reads.
type AuditLog interface {
	Append(ctx context.Context, e audit.Entry) (uint64, [32]byte, error)
	Query(ctx context.Context, f audit.Filter, p audit.Page) ([]audit.Record, string, error)
	Checkpoint(ctx context.Context) (audit.Checkpoint, error)
	LatestCheckpoint() (audit.Checkpoint, error)
	InclusionProof(ctx context.Context, index, treeSize uint64) ([][]byte, error)
	ConsistencyProof(ctx context.Context, from, to uint64) ([][]byte, error)
	LeafHashAt(index uint64) ([32]byte, error)
	Export(ctx context.Context, dir string, treeSize uint64) (audit.Checkpoint, error)
}

// What is recorded, and when (the audit contract):
//
//   - every call authorization refuses: a "deny" entry, before the caller
//     gets PermissionDenied (authz.WithRefusalRecorder);
//   - every renewal or release of a grant that is not the caller's (or
//     does not exist): a "deny" entry naming the grant, its job and host,
//     before the caller gets NotFound without them (refuseGrant);
//   - every allowed call that changes state: its entry BEFORE the change,
//     so nothing changes without a durable entry. If the append fails the
//     change is not made and the caller gets Unavailable. If the change
//     then fails, a second entry says so (the first stays: the log is
//     append-only).
//
//   - every malformed request (InvalidArgument from validation or
//     describe, before policy sees it): an "invalid_argument" entry naming
//     the caller, the RPC and the field and rule that failed, never a value
//     the caller sent (recordInvalid), before the caller gets its answer.
//     If the append fails the caller still gets InvalidArgument: nothing
//     was changed.
//
// Not recorded: reads (Get, List, Query, proofs) that were allowed, even
// when their handler then fails, and peers without a verified SVID
// (refused in the TLS handshake, before any RPC: there is no caller to
// name).
//
// Grants and renewals (and their failures), each revoked grant and each
// expiry are recorded by the lease package, which knows the keys and
// grants involved, from the call's typed scope (lease.ScopeEntry: the same
// fields entryFor makes of that scope's input); key rotations are recorded
// also by the key manager (version and fingerprint, before the write),
// policy loads by the daemon.

// changeKinds are the state-changing RPCs the audit interceptor records.
var changeKinds = map[string]audit.EventKind{
	"/nvmegate.v1.Inventory/AddTarget":         audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/RemoveTarget":      audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/AddSubsystem":      audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/RemoveSubsystem":   audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/AddNamespace":      audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/RemoveNamespace":   audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/AddHostBinding":    audit.EventInventoryChange,
	"/nvmegate.v1.Inventory/RemoveHostBinding": audit.EventInventoryChange,
	"/nvmegate.v1.Keys/Rotate":                 audit.EventKeyRotation,
	"/nvmegate.v1.TargetAgent/Reencrypted":     audit.EventKeyRotation,
	"/nvmegate.v1.Jobs/Admit":                  audit.EventJobAdmit,
	"/nvmegate.v1.Jobs/Finish":                 audit.EventJobFinish,
	"/nvmegate.v1.Jobs/UpdateNodes":            audit.EventJobNodes,
	"/nvmegate.v1.Access/Release":              audit.EventRelease,
	"/nvmegate.v1.Access/Revoke":               audit.EventRevoke,
}

type auditIndexKey struct{}

// auditIndexFromContext is the log index of the entry recorded for this
// call: before its handler ran, or by the handler's write that recorded
// it (recordedWithChange).
func auditIndexFromContext(ctx context.Context) (uint64, bool) {
	if r, ok := ctx.Value(auditIndexKey{}).(*store.CallRecord); ok {
		return r.Index()
	}
	i, ok := ctx.Value(auditIndexKey{}).(uint64)
	return i, ok
}

// recordedWithChange are the calls whose change is one store write and
// nothing else (host bindings are not: a rebind rotates keys and revokes
// grants, whose writes would take the call's record first): on a journaled store their entry is recorded in
// that write's commit (store.CallRecord), one durable round, rather than
// before the handler runs. The others change what the store does not
// hold (keys, targets) before or besides their writes, and keep their
// entry first.
var recordedWithChange = map[string]bool{
	"/nvmegate.v1.Inventory/AddTarget":       true,
	"/nvmegate.v1.Inventory/RemoveTarget":    true,
	"/nvmegate.v1.Inventory/AddSubsystem":    true,
	"/nvmegate.v1.Inventory/RemoveSubsystem": true,
	"/nvmegate.v1.Jobs/Admit":                true,
}

// errAuditUnavailable answers a change that was not made because its entry
// could not be made durable.
var errAuditUnavailable = nvmegate.Errorf(nvmegate.EUNAVAILABLE, "audit log unavailable: nothing was changed; retry later")

// auditChanges is the innermost unary interceptor: it records the
// state-changing calls of changeKinds around their handlers.
func (s *Server) auditChanges(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	kind, ok := changeKinds[info.FullMethod]
	if !ok {
		return h(ctx, req)
	}
	in, ok := authz.InputFromContext(ctx)
	if !ok {
		// Only the authz interceptor reaches here; without its input the
		// chain is miswired, and nothing may change unrecorded.
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "audit: call has no authorization input")
	}
	d, _ := authz.DecisionFromContext(ctx)
	e := entryFor(in, d, kind)
	e.Time = s.now()
	if recordedWithChange[info.FullMethod] && s.journaled {
		return s.auditWithChange(ctx, req, info, h, e)
	}
	idx, _, err := s.audit.Append(ctx, e)
	if err != nil {
		s.log.ErrorContext(ctx, "audit append failed; change refused", "method", info.FullMethod, "error", err)
		return nil, errAuditUnavailable
	}
	resp, err := h(context.WithValue(ctx, auditIndexKey{}, idx), req)
	if err != nil {
		e.Time = s.now()
		e.Detail = fmt.Sprintf("%s failed (%s)", e.Detail, codeName(err))
		if _, _, aerr := s.audit.Append(context.WithoutCancel(ctx), e); aerr != nil {
			s.log.ErrorContext(ctx, "audit append of a failed change failed", "method", info.FullMethod, "error", aerr)
		}
	}
	return resp, err
}

// auditWithChange runs a call of recordedWithChange whose entry e its
// first store write records. A call whose writes recorded nothing changed
// nothing in the store: its entry is appended after it, and its failure as
// before.
func (s *Server) auditWithChange(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler, e audit.Entry) (any, error) {
	rec := &store.CallRecord{Entry: e}
	resp, err := h(context.WithValue(store.WithCallRecord(ctx, rec), auditIndexKey{}, rec), req)
	if _, recorded := rec.Index(); !recorded {
		if _, _, aerr := s.audit.Append(context.WithoutCancel(ctx), e); aerr != nil {
			s.log.ErrorContext(ctx, "audit append of a call that changed nothing failed", "method", info.FullMethod, "error", aerr)
			// The log is down: the write failed for that (the store
			// changes only through the log), unless the rules refused
			// it first — a refusal stays a refusal.
			if err == nil || nvmegate.ErrorCode(err) == "" || nvmegate.ErrorCode(err) == nvmegate.EINTERNAL {
				return nil, errAuditUnavailable
			}
		}
	}
	if err != nil {
		e.Time = s.now()
		e.Detail = fmt.Sprintf("%s failed (%s)", e.Detail, codeName(err))
		if _, _, aerr := s.audit.Append(context.WithoutCancel(ctx), e); aerr != nil {
			s.log.ErrorContext(ctx, "audit append of a failed change failed", "method", info.FullMethod, "error", aerr)
		}
	}
	return resp, err
}

// codeName names an error's kind for an entry: the domain code, never the
// message (which may quote input).
func codeName(err error) string {
	if c := nvmegate.ErrorCode(err); c != "" {
		return c
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "canceled"
	}
	return nvmegate.EINTERNAL
}

// recordRefusal is the authz.RefusalRecorder: a deny entry per refused call.
func (s *Server) recordRefusal(ctx context.Context, in *authz.Input, d *nvmegate.Decision, err error) error {
	e := entryFor(in, d, audit.EventDeny)
	e.Time = s.now()
	if err != nil {
		e.Detail += ": authorization failed"
	}
	// The caller is refused whatever happens here; record even if it hung up.
	_, _, aerr := s.audit.Append(context.WithoutCancel(ctx), e)
	return aerr
}

// refuseGrant records a renewal or release of a grant that is not the
// caller's (describe.go callersGrant) as a deny entry — with the grant's
// job, tenant and host NQN when it exists, for the auditor — and returns
// the caller's answer: the same NotFound for another's grant as for none.
func (s *Server) refuseGrant(ctx context.Context, method string, ng *notCallersGrant) error {
	e := audit.Entry{Kind: audit.EventDeny, Time: s.now(), GrantID: ng.id,
		Detail: authz.ActionFromMethod(method) + " " + ng.id + ": no such grant"}
	if id, ok := identity.PeerID(ctx); ok {
		e.Caller = id.String()
	}
	if g := ng.grant; g != nil {
		e.JobID, e.Tenant, e.HostNQN, e.SubsystemNQN = g.JobID, g.Tenant, g.HostNQN, g.SubsystemNQN
		e.Detail = authz.ActionFromMethod(method) + " " + ng.id + ": the grant of another node (" + g.Node + ")"
	}
	// The caller is refused whatever happens here; record even if it hung up.
	if _, _, err := s.audit.Append(context.WithoutCancel(ctx), e); err != nil {
		s.log.ErrorContext(ctx, "audit append of a refusal failed", "method", method, "error", err)
	}
	return toStatus(ctx, s.log, method, errGrantNotFound)
}

// recordInvalid records a request refused as malformed before the caller
// is answered: an invalid_argument entry with the caller's SPIFFE ID, the
// RPC and the refusal's field and rule (invalidDetail), nothing else of the
// request. One append, group-committed with the others in flight: a flood
// of malformed calls costs a share of a commit each, and is bounded by the
// in-flight limit (limit.go) like any other call. A call without a
// verified SPIFFE ID is not recorded (none reaches an RPC: the handshake
// refuses it). The refusal stands whatever happens here.
func (s *Server) recordInvalid(ctx context.Context, method string, err error) {
	if nvmegate.ErrorCode(err) != nvmegate.EINVALID {
		return
	}
	id, ok := identity.PeerID(ctx)
	if !ok || id.IsZero() {
		return
	}
	e := audit.Entry{Kind: audit.EventInvalid, Time: s.now(), Caller: id.String(),
		Detail: method + ": invalid argument: " + invalidDetail(err)}
	// Record even if the caller hung up.
	ctx = context.WithoutCancel(ctx)
	_, _, aerr := s.audit.Append(ctx, e)
	if errors.Is(aerr, audit.ErrKeyMaterial) || errors.Is(aerr, audit.ErrInvalidEntry) {
		// The message still held something the log refuses (a validator
		// that echoes a value unquoted): the field alone. Append refuses
		// such an entry before it is queued, so this costs no commit.
		e.Detail = method + ": invalid argument: " + invalidField(err)
		_, _, aerr = s.audit.Append(ctx, e)
	}
	if aerr != nil {
		s.log.ErrorContext(ctx, "audit append of an invalid request failed", "method", method, "error", aerr)
	}
}

// invalidDetail is "<field>: <rule>" of a validation error with every value
// the caller sent withheld: validators quote the values they show (Go
// syntax, nvmegate's show), and each quoted string becomes "…". A request
// field may hold anything, key material pasted into the wrong field
// included, and the log keeps it forever; the caller's answer, which only
// it sees, keeps the values.
func invalidDetail(err error) string {
	var e *nvmegate.Error
	if !errors.As(err, &e) {
		return "invalid request"
	}
	msg := nvmegate.WithholdQuoted(e.Message)
	if e.Field == "" {
		return msg
	}
	return e.Field + ": " + msg
}

// invalidField is the field of a validation error (the request's field
// path, never a value), or "invalid request".
func invalidField(err error) string {
	var e *nvmegate.Error
	if !errors.As(err, &e) || e.Field == "" {
		return "invalid request"
	}
	return e.Field
}

// entryFor builds the entry of a call from its policy input: the records
// the call is about, as described from the store (describe.go), and the
// decision. Detail is the action and the record's key.
func entryFor(in *authz.Input, d *nvmegate.Decision, kind audit.EventKind) audit.Entry {
	// A connect's or renew's resource is typed (Input.Scope); its map is
	// built here, for the refusals only: an allowed one is recorded by the
	// lease from the same scope (lease.ScopeEntry, which
	// TestScopeEntryIsEntryFor holds to this).
	r := in.ResourceMap()
	e := audit.Entry{
		Kind:         kind,
		Caller:       in.Caller.ID,
		Tenant:       str(r, "tenant"),
		JobID:        str(r, "job", "job_id"),
		SubsystemNQN: str(r, "subsystem", "nqn"),
		HostNQN:      str(r, "host_binding", "host_nqn"),
		Detail:       in.Action,
	}
	if t, err := time.Parse(time.RFC3339Nano, str(r, "job", "expires_at")); err == nil {
		e.ExpiresAt = t
	}
	if e.Tenant == "" {
		e.Tenant = firstSet(str(r, "job", "tenant"), str(r, "subsystem", "tenant"), str(r, "host_binding", "tenant"))
	}
	nss, _ := r["namespaces"].([]any)
	for _, x := range nss {
		ns, _ := x.(map[string]any)
		nsid, _ := ns["nsid"].(int64)
		if nsid <= 0 || nsid > 0xFFFFFFFF {
			continue
		}
		e.Namespaces = append(e.Namespaces, audit.Namespace{
			SubsystemNQN:  str(ns, "subsystem_nqn"),
			NSID:          uint32(nsid),
			Mode:          str(ns, "mode"),
			Dataset:       str(ns, "dataset", "name"),
			DatasetDigest: str(ns, "dataset", "digest"),
		})
	}
	if key := resourceKey(r); key != "" {
		e.Detail += " " + key
	}
	if d != nil {
		e.Decision = &audit.Decision{Allow: d.Allow, ID: d.ID, PolicyRevision: d.PolicyRevision, Reasons: d.Reasons}
	}
	return e
}

// resourceKey names the record an inventory call is about.
func resourceKey(r map[string]any) string {
	switch str(r, "kind") {
	case "target":
		return str(r, "target", "id")
	case "subsystem":
		return str(r, "subsystem", "nqn")
	case "job":
		job, _ := r["job"].(map[string]any)
		if g, _ := job["generation"].(int64); g > 0 {
			// The runs of a requeued job stay apart in the log.
			return str(r, "job", "job_id") + " generation " + strconv.FormatInt(g, 10)
		}
		return str(r, "job", "job_id")
	case "key":
		k, _ := r["key"].(map[string]any)
		name := str(r, "subsystem", "nqn")
		if nsid, ok := k["nsid"].(int64); ok {
			name += "/" + strconv.FormatInt(nsid, 10)
		}
		return str(r, "key", "class") + " " + name
	case "host_binding":
		return str(r, "host_binding", "spiffe_id")
	case "namespace":
		nss, _ := r["namespaces"].([]any)
		if len(nss) == 1 {
			ns, _ := nss[0].(map[string]any)
			nsid, _ := ns["nsid"].(int64)
			return str(ns, "subsystem_nqn") + "/" + strconv.FormatInt(nsid, 10)
		}
	}
	return ""
}

// str reads a string at path in nested maps; "" if absent.
func str(m map[string]any, path ...string) string {
	for i, k := range path {
		v, ok := m[k]
		if !ok {
			return ""
		}
		if i == len(path)-1 {
			s, _ := v.(string)
			return s
		}
		if m, ok = v.(map[string]any); !ok {
			return ""
		}
	}
	return ""
}

func firstSet(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

// auditService answers the Audit RPCs from the log. Policy has already
// decided who may read it (auditors and admins in the default policy).
type auditService struct {
	pb.UnimplementedAuditServer
	log       AuditLog
	jobs      JobStore       // nil: no lineage
	store     InventoryStore // the datasets of a job's namespaces
	signer    attest.Signer  // signs lineage envelopes; nil: no lineage
	exportDir string         // where exports are staged; "" means os.TempDir()
	// attest makes a compliance attestation (Server.AttestCompliance).
	attest func(ctx context.Context) (*Attested, error)
}

// Compliance makes, signs and records a compliance attestation.
func (s *auditService) Compliance(ctx context.Context, _ *pb.ComplianceRequest) (*pb.ComplianceResponse, error) {
	a, err := s.attest(ctx)
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(a.Bundle, "", "  ")
	if err != nil {
		return nil, err
	}
	return &pb.ComplianceResponse{Bundle: b, OutOfCompliance: uint32(len(a.Predicate.OutOfCompliance)), Index: a.Bundle.Index}, nil
}

// auditErr maps the log's errors to domain errors with caller-safe messages.
func auditErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, audit.ErrInvalidQuery):
		return nvmegate.Invalid("page_token", "is not a token this log issued")
	case errors.Is(err, audit.ErrTreeSize):
		return nvmegate.Errorf(nvmegate.EINVALID, "index or tree size is beyond the log")
	case errors.Is(err, audit.ErrNoCheckpoint):
		return nvmegate.Errorf(nvmegate.ENOTFOUND, "no signed checkpoint of that tree size")
	case errors.Is(err, audit.ErrUnavailable), errors.Is(err, audit.ErrClosed), errors.Is(err, audit.ErrFailed):
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "audit log unavailable")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("audit: %w", err) // Internal; the status interceptor logs it
}

func (s *auditService) Query(ctx context.Context, r *pb.QueryRequest) (*pb.QueryResponse, error) {
	f := audit.Filter{JobID: r.JobId, Tenant: r.Tenant, SubsystemNQN: r.SubsystemNqn, NSID: r.Nsid}
	if r.Since != nil {
		f.Since = r.Since.AsTime()
	}
	if r.Until != nil {
		f.Until = r.Until.AsTime()
	}
	for _, k := range r.Kinds {
		f.Kinds = append(f.Kinds, audit.EventKind(k))
	}
	recs, next, err := s.log.Query(ctx, f, audit.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, auditErr(err)
	}
	out := &pb.QueryResponse{NextPageToken: next, Entries: make([]*pb.AuditEntry, 0, len(recs))}
	for i := range recs {
		out.Entries = append(out.Entries, entryToProto(&recs[i]))
	}
	return out, nil
}

func entryToProto(r *audit.Record) *pb.AuditEntry {
	e := &r.Entry
	p := &pb.AuditEntry{
		Index: r.Index, LeafHash: r.LeafHash[:], Entry: r.Raw, Time: timestamppb.New(e.Time),
		Kind: string(e.Kind), JobId: e.JobID, Tenant: e.Tenant, Caller: e.Caller,
	}
	if e.Decision != nil {
		p.DecisionId, p.Allow = e.Decision.ID, e.Decision.Allow
	}
	return p
}

// Checkpoint signs one if the log grew (the checkpointer would within a
// second anyway), so that an auditor always gets one covering every entry
// appended before the call.
func (s *auditService) Checkpoint(ctx context.Context, _ *pb.CheckpointRequest) (*pb.CheckpointResponse, error) {
	c, err := s.log.Checkpoint(ctx)
	if errors.Is(err, audit.ErrNoSigner) {
		c, err = s.log.LatestCheckpoint()
	}
	if err != nil {
		return nil, auditErr(err)
	}
	return &pb.CheckpointResponse{Checkpoint: c.Note, Size: c.Size, RootHash: c.Hash[:]}, nil
}

// latestSize is the tree size of the latest signed checkpoint: proofs
// default to it, as a verifier can only check them against a signed root.
func (s *auditService) latestSize() (uint64, error) {
	c, err := s.log.LatestCheckpoint()
	if err != nil {
		if errors.Is(err, audit.ErrNoCheckpoint) {
			return 0, nvmegate.Errorf(nvmegate.ECONFLICT, "the log has no signed checkpoint yet; ask for one with Audit.Checkpoint")
		}
		return 0, auditErr(err)
	}
	return c.Size, nil
}

func (s *auditService) InclusionProof(ctx context.Context, r *pb.InclusionProofRequest) (*pb.InclusionProofResponse, error) {
	size := r.TreeSize
	if size == 0 {
		var err error
		if size, err = s.latestSize(); err != nil {
			return nil, err
		}
		if r.Index >= size {
			return nil, nvmegate.Invalid("index", "%d is not covered by the latest checkpoint (tree size %d)", r.Index, size)
		}
	}
	hashes, err := s.log.InclusionProof(ctx, r.Index, size)
	if err != nil {
		return nil, auditErr(err)
	}
	leaf, err := s.log.LeafHashAt(r.Index)
	if err != nil {
		return nil, auditErr(err)
	}
	return &pb.InclusionProofResponse{Index: r.Index, TreeSize: size, LeafHash: leaf[:], Hashes: hashes}, nil
}

func (s *auditService) ConsistencyProof(ctx context.Context, r *pb.ConsistencyProofRequest) (*pb.ConsistencyProofResponse, error) {
	to := r.ToSize
	if to == 0 {
		var err error
		if to, err = s.latestSize(); err != nil {
			return nil, err
		}
		if r.FromSize > to {
			return nil, nvmegate.Invalid("from_size", "%d exceeds the latest checkpoint's tree size %d", r.FromSize, to)
		}
	}
	hashes, err := s.log.ConsistencyProof(ctx, r.FromSize, to)
	if err != nil {
		return nil, auditErr(err)
	}
	return &pb.ConsistencyProofResponse{FromSize: r.FromSize, ToSize: to, Hashes: hashes}, nil
}

// Export writes the tlog-tiles export of a signed tree size into a staging
// directory and streams its files, then removes it.
func (s *auditService) Export(r *pb.ExportRequest, stream grpc.ServerStreamingServer[pb.ExportResponse]) error {
	ctx := stream.Context()
	size := r.TreeSize
	if size == 0 {
		// A fresh checkpoint, so that the export covers every entry so far.
		if _, err := s.log.Checkpoint(ctx); err != nil && !errors.Is(err, audit.ErrNoSigner) {
			return auditErr(err)
		}
		var err error
		if size, err = s.latestSize(); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp(s.exportDir, "export-")
	if err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	defer os.RemoveAll(dir)
	if _, err := s.log.Export(ctx, filepath.Join(dir, "out"), size); err != nil {
		return auditErr(err)
	}
	root := filepath.Join(dir, "out")
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return stream.Send(&pb.ExportResponse{Path: filepath.ToSlash(rel), Data: data})
	})
}

// Lineage builds and signs a job's lineage attestation (lineage package):
// its datasets, scope and every log entry of the job with an inclusion
// proof against a checkpoint signed now.
func (s *auditService) Lineage(ctx context.Context, r *pb.LineageRequest) (*pb.LineageResponse, error) {
	env, err := s.lineage(ctx, r.JobId)
	if err != nil {
		return nil, err
	}
	return &pb.LineageResponse{Envelope: env}, nil
}

// lineage builds and signs a job's lineage envelope.
func (s *auditService) lineage(ctx context.Context, jobID string) ([]byte, error) {
	if s.jobs == nil || s.signer == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway signs no lineage (no job store or signer)")
	}
	j, err := s.jobs.Job(ctx, jobID)
	if err != nil {
		return nil, err
	}
	datasets := map[string]lineage.NamespaceUse{}
	for _, jn := range j.Namespaces {
		n, err := s.store.Namespace(ctx, jn.SubsystemNQN, jn.NSID)
		if err != nil {
			return nil, err
		}
		datasets[lineage.NamespaceKey(jn.SubsystemNQN, jn.NSID)] = lineage.NamespaceUse{Dataset: n.Dataset.Name, DatasetDigest: n.Dataset.Digest}
	}
	st, err := lineage.Build(ctx, s.log, j, datasets)
	if err != nil {
		return nil, auditErr(err)
	}
	env, err := lineage.Sign(ctx, st, s.signer)
	if err != nil {
		return nil, fmt.Errorf("lineage: %w", err)
	}
	return env, nil
}
