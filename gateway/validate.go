package gateway

import (
	"encoding/json"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// Input validation for every request of the API, run by an interceptor
// before policy sees the request: policy input is built only from
// well-formed requests, and a malformed request gets InvalidArgument naming
// the field, whether or not its service is built yet.

const (
	maxPageSize     = store.MaxPageSize
	maxExplainInput = 1 << 20
	maxModules      = 64
)

var eventKindRE = regexp.MustCompile(`^[a-z][a-z_]{0,31}$`)

// validate checks req. now is used for expiry checks.
func validate(req any, now time.Time) error {
	switch r := req.(type) {
	// Inventory
	case *pb.AddTargetRequest:
		t, err := targetFromProto(r.Target)
		if err == nil {
			err = t.Validate()
		}
		return nvmegate.WithFieldPrefix("target", err)
	case *pb.GetTargetRequest:
		return nvmegate.ValidateLabel("id", r.Id)
	case *pb.RemoveTargetRequest:
		return nvmegate.ValidateLabel("id", r.Id)
	case *pb.ListTargetsRequest:
		return first(
			optional(nvmegate.ValidateLabel, "region", r.Region),
			optional(nvmegate.ValidateLabel, "fabric", r.Fabric),
			page(r.PageSize, r.PageToken),
		)
	case *pb.AddSubsystemRequest:
		s, err := subsystemFromProto(r.Subsystem)
		if err == nil {
			err = s.Validate()
		}
		return nvmegate.WithFieldPrefix("subsystem", err)
	case *pb.GetSubsystemRequest:
		return nvmegate.ValidateNQN("nqn", r.Nqn)
	case *pb.RemoveSubsystemRequest:
		return nvmegate.ValidateNQN("nqn", r.Nqn)
	case *pb.ListSubsystemsRequest:
		return first(
			optional(nvmegate.ValidateTenant, "tenant", r.Tenant),
			optional(nvmegate.ValidateLabel, "target_id", r.TargetId),
			page(r.PageSize, r.PageToken),
		)
	case *pb.AddNamespaceRequest:
		n, err := namespaceFromProto(r.Namespace)
		if err == nil {
			err = n.Validate()
		}
		return nvmegate.WithFieldPrefix("namespace", err)
	case *pb.GetNamespaceRequest:
		return namespaceKey(r.SubsystemNqn, r.Nsid)
	case *pb.RemoveNamespaceRequest:
		return namespaceKey(r.SubsystemNqn, r.Nsid)
	case *pb.ListNamespacesRequest:
		return first(
			optional(nvmegate.ValidateTenant, "tenant", r.Tenant),
			optional(nvmegate.ValidateNQN, "subsystem_nqn", r.SubsystemNqn),
			optional(nvmegate.ValidateLabel, "region", r.Region),
			page(r.PageSize, r.PageToken),
		)
	case *pb.AddHostBindingRequest:
		h, err := hostBindingFromProto(r.Binding)
		if err == nil {
			err = h.Validate()
		}
		return nvmegate.WithFieldPrefix("binding", err)
	case *pb.GetHostBindingRequest:
		return nvmegate.ValidateSPIFFEID("spiffe_id", r.SpiffeId)
	case *pb.RemoveHostBindingRequest:
		return nvmegate.ValidateSPIFFEID("spiffe_id", r.SpiffeId)
	case *pb.ListHostBindingsRequest:
		return first(
			optional(nvmegate.ValidateTenant, "tenant", r.Tenant),
			page(r.PageSize, r.PageToken),
		)

	// Jobs
	case *pb.AdmitRequest:
		j, err := jobFromAdmit(r)
		if err != nil {
			return err
		}
		return j.Validate(now)
	case *pb.JobsGetRequest:
		return nvmegate.ValidateJobID("job_id", r.JobId)
	case *pb.JobsListRequest:
		return first(
			optional(nvmegate.ValidateTenant, "tenant", r.Tenant),
			enum("state", int32(r.State), pb.JobState_name),
			page(r.PageSize, r.PageToken),
		)
	case *pb.FinishRequest:
		return first(
			nvmegate.ValidateJobID("job_id", r.JobId),
			reason(r.Reason, false),
		)
	case *pb.UpdateNodesRequest:
		return validateUpdateNodes(r)

	// Access
	case *pb.DiscoverRequest:
		return nvmegate.ValidateJobID("job_id", r.JobId)
	case *pb.ConnectRequest:
		return first(
			nvmegate.ValidateJobID("job_id", r.JobId),
			nvmegate.ValidateNQN("subsystem_nqn", r.SubsystemNqn),
			optional(nvmegate.ValidateNQN, "host_nqn", r.HostNqn),
			ttl("ttl", r.Ttl),
		)
	case *pb.RenewRequest:
		return first(
			nvmegate.ValidateGrantID("grant_id", r.GrantId),
			ttl("ttl", r.Ttl),
		)
	case *pb.ReleaseRequest:
		return nvmegate.ValidateGrantID("grant_id", r.GrantId)
	case *pb.ListGrantsRequest:
		return first(
			optional(nvmegate.ValidateJobID, "job_id", r.JobId),
			optional(nvmegate.ValidateSPIFFEID, "node", r.Node),
			enum("state", int32(r.State), pb.GrantState_name),
			page(r.PageSize, r.PageToken),
		)
	case *pb.RevokeRequest:
		var err error
		switch s := r.Selector.(type) {
		case *pb.RevokeRequest_GrantId:
			err = nvmegate.ValidateGrantID("grant_id", s.GrantId)
		case *pb.RevokeRequest_JobId:
			err = nvmegate.ValidateJobID("job_id", s.JobId)
		case *pb.RevokeRequest_Node:
			err = nvmegate.ValidateSPIFFEID("node", s.Node)
		default:
			err = nvmegate.Invalid("selector", "one of grant_id, job_id or node is required")
		}
		return first(err, reason(r.Reason, true))

	// Keys
	case *pb.RotateRequest:
		if err := nvmegate.ValidateNQN("subsystem_nqn", r.SubsystemNqn); err != nil {
			return err
		}
		switch r.Kind {
		case pb.KeyKind_KEY_KIND_ACCESS_ROOT:
			if r.Nsid != 0 {
				return nvmegate.Invalid("nsid", "must be 0 for an access root")
			}
		case pb.KeyKind_KEY_KIND_DATA_KEY:
			if err := nvmegate.ValidateNSID("nsid", r.Nsid); err != nil {
				return err
			}
		default:
			return nvmegate.Invalid("kind", "must be KEY_KIND_ACCESS_ROOT or KEY_KIND_DATA_KEY")
		}
		if r.Reencrypt && r.Kind != pb.KeyKind_KEY_KIND_DATA_KEY {
			return nvmegate.Invalid("reencrypt", "only a data key is re-encrypted")
		}
		return reason(r.Reason, false)
	case *pb.KeysStatusRequest:
		return first(
			optional(nvmegate.ValidateNQN, "subsystem_nqn", r.SubsystemNqn),
			enum("kind", int32(r.Kind), pb.KeyKind_name),
		)

	// Policy
	case *pb.ExplainRequest:
		return validateExplain(r)
	case *pb.PolicyStatusRequest:
		return nil
	case *pb.ImpactRequest:
		return validateImpact(r)

	// Audit
	case *pb.QueryRequest:
		return validateQuery(r)
	case *pb.CheckpointRequest, *pb.ComplianceRequest:
		return nil
	case *pb.InclusionProofRequest:
		if r.TreeSize != 0 && r.Index >= r.TreeSize {
			return nvmegate.Invalid("index", "must be less than tree_size %d (got %d)", r.TreeSize, r.Index)
		}
		return nil
	case *pb.ConsistencyProofRequest:
		if r.FromSize == 0 {
			return nvmegate.Invalid("from_size", "must be at least 1")
		}
		if r.ToSize != 0 && r.FromSize > r.ToSize {
			return nvmegate.Invalid("from_size", "must not exceed to_size %d (got %d)", r.ToSize, r.FromSize)
		}
		return nil
	case *pb.ExportRequest:
		return nil
	case *pb.LineageRequest:
		return nvmegate.ValidateJobID("job_id", r.JobId)

	// TargetAgent
	case *pb.WatchRequest:
		return nil // empty: the target is the caller's own
	case *pb.ReencryptedRequest:
		if r.Generation < 2 {
			return nvmegate.Invalid("generation", "must be the generation re-encrypted to (2 or more)")
		}
		if len(r.Error) > 4096 {
			return nvmegate.Invalid("error", "must be at most 4096 bytes")
		}
		return first(nvmegate.ValidateNQN("subsystem_nqn", r.SubsystemNqn), nvmegate.ValidateNSID("nsid", r.Nsid))
	case *pb.AckRequest:
		if r.Generation == 0 {
			return nvmegate.Invalid("generation", "must be a generation the gateway sent (1 or more)")
		}
		if len(r.Error) > 4096 {
			return nvmegate.Invalid("error", "must be at most 4096 bytes")
		}
		return nil
	}
	// Requests of services that are not ours (health, reflection) are
	// validated by their own implementations. A request of our API without
	// a case above is a bug: refuse it rather than let it through unchecked.
	if m, ok := req.(proto.Message); ok && strings.HasPrefix(string(m.ProtoReflect().Descriptor().FullName()), "nvmegate.") {
		return nvmegate.Errorf(nvmegate.EINTERNAL, "no validation for %s", m.ProtoReflect().Descriptor().FullName())
	}
	return nil
}

func validateExplain(r *pb.ExplainRequest) error {
	if len(r.InputJson) == 0 {
		return nvmegate.Invalid("input_json", "is required")
	}
	if len(r.InputJson) > maxExplainInput {
		return nvmegate.Invalid("input_json", "must be at most %d bytes (got %d)", maxExplainInput, len(r.InputJson))
	}
	var obj map[string]any
	if err := json.Unmarshal(r.InputJson, &obj); err != nil {
		return nvmegate.Invalid("input_json", "must be a JSON object: %v", err)
	}
	if len(r.CandidateModules) > maxModules {
		return nvmegate.Invalid("candidate_modules", "at most %d modules (got %d)", maxModules, len(r.CandidateModules))
	}
	for name := range r.CandidateModules {
		if err := nvmegate.ValidateString("candidate_modules", name); err != nil {
			return err
		}
		if !strings.HasSuffix(name, ".rego") || strings.ContainsAny(name, "/\\") || len(name) > 255 {
			return nvmegate.Invalid("candidate_modules", "module names must be plain file names ending in .rego (got %q)", name)
		}
	}
	return nil
}

// maxCandidateBytes bounds a candidate policy's files, together.
const maxCandidateBytes = 3 << 20 // under the server's 4 MiB message limit

func validateImpact(r *pb.ImpactRequest) error {
	if len(r.CandidateFiles) == 0 {
		return nvmegate.Invalid("candidate_files", "is required: the candidate policy's files")
	}
	if len(r.CandidateFiles) > maxModules {
		return nvmegate.Invalid("candidate_files", "at most %d files (got %d)", maxModules, len(r.CandidateFiles))
	}
	total := 0
	for name, data := range r.CandidateFiles {
		if err := nvmegate.ValidateString("candidate_files", name); err != nil {
			return err
		}
		if !fs.ValidPath(name) || name == "." || len(name) > 255 {
			return nvmegate.Invalid("candidate_files", "file names must be relative slash-separated paths without . or .. (got %q)", name)
		}
		total += len(data)
	}
	if total > maxCandidateBytes {
		return nvmegate.Invalid("candidate_files", "must be at most %d bytes together (got %d)", maxCandidateBytes, total)
	}
	return nil
}

func validateQuery(r *pb.QueryRequest) error {
	err := first(
		optional(nvmegate.ValidateJobID, "job_id", r.JobId),
		optional(nvmegate.ValidateTenant, "tenant", r.Tenant),
		optional(nvmegate.ValidateNQN, "subsystem_nqn", r.SubsystemNqn),
		timestamp("since", r.Since),
		timestamp("until", r.Until),
		page(r.PageSize, r.PageToken),
	)
	if err != nil {
		return err
	}
	if r.Nsid != 0 {
		if r.SubsystemNqn == "" {
			return nvmegate.Invalid("nsid", "needs subsystem_nqn")
		}
		if err := nvmegate.ValidateNSID("nsid", r.Nsid); err != nil {
			return err
		}
	}
	if r.Since != nil && r.Until != nil && !r.Since.AsTime().Before(r.Until.AsTime()) {
		return nvmegate.Invalid("until", "must be after since")
	}
	for i, k := range r.Kinds {
		if !eventKindRE.MatchString(k) {
			return nvmegate.Invalid("kinds["+strconv.Itoa(i)+"]", "must be an event kind like grant or job_admit")
		}
	}
	return nil
}

// validateUpdateNodes checks a change of a job's nodes: at least one node
// named, each a node ID, none both added and removed.
func validateUpdateNodes(r *pb.UpdateNodesRequest) error {
	if err := nvmegate.ValidateJobID("job_id", r.JobId); err != nil {
		return err
	}
	if r.AddHostlist != "" || r.RemoveHostlist != "" {
		return nvmegate.Invalid("add_hostlist", "was not expanded")
	}
	if len(r.AddNodes) == 0 && len(r.RemoveNodes) == 0 {
		return nvmegate.Invalid("add_nodes", "a change names at least one node to add or remove")
	}
	if n := len(r.AddNodes) + len(r.RemoveNodes); n > nvmegate.MaxJobNodes {
		return nvmegate.Invalid("add_nodes", "at most %d nodes in one change (got %d)", nvmegate.MaxJobNodes, n)
	}
	adding := make(map[string]bool, len(r.AddNodes))
	for i, n := range r.AddNodes {
		if err := nvmegate.ValidateNodeID("add_nodes["+strconv.Itoa(i)+"]", n); err != nil {
			return err
		}
		adding[n] = true
	}
	for i, n := range r.RemoveNodes {
		f := "remove_nodes[" + strconv.Itoa(i) + "]"
		if err := nvmegate.ValidateNodeID(f, n); err != nil {
			return err
		}
		if adding[n] {
			return nvmegate.Invalid(f, "node %s is both added and removed", n)
		}
	}
	return nil
}

// jobFromAdmit converts an Admit request to the domain's Job.
func jobFromAdmit(r *pb.AdmitRequest) (*nvmegate.Job, error) {
	if r.Hostlist != "" {
		// Expanded into nodes before validation (expandHostlists).
		return nil, nvmegate.Invalid("hostlist", "was not expanded")
	}
	j := &nvmegate.Job{ID: r.JobId, Tenant: r.Tenant, Nodes: r.Nodes, AllowedRegions: r.AllowedRegions,
		Generation: r.Generation, User: r.User}
	for i, ns := range r.Namespaces {
		f := "namespaces[" + strconv.Itoa(i) + "]"
		if ns == nil {
			return nil, nvmegate.Invalid(f, "is required")
		}
		var mode string
		switch ns.Mode {
		case pb.AccessMode_ACCESS_MODE_READ_ONLY:
			mode = nvmegate.ModeReadOnly
		case pb.AccessMode_ACCESS_MODE_READ_WRITE:
			mode = nvmegate.ModeReadWrite
		default:
			return nil, nvmegate.Invalid(f+".mode", "must be ACCESS_MODE_READ_ONLY or ACCESS_MODE_READ_WRITE")
		}
		j.Namespaces = append(j.Namespaces, nvmegate.JobNamespace{SubsystemNQN: ns.SubsystemNqn, NSID: ns.Nsid, Mode: mode})
	}
	if err := timestamp("expires_at", r.ExpiresAt); err != nil {
		return nil, err
	}
	if r.ExpiresAt != nil {
		j.ExpiresAt = r.ExpiresAt.AsTime()
	}
	return j, nil
}

func namespaceKey(nqn string, nsid uint32) error {
	return first(nvmegate.ValidateNQN("subsystem_nqn", nqn), nvmegate.ValidateNSID("nsid", nsid))
}

// page checks the page size; the token is opaque here and checked by the
// store that issued it.
func page(size int32, _ string) error {
	if size < 0 || size > maxPageSize {
		return nvmegate.Invalid("page_size", "must be 0-%d (got %d)", maxPageSize, size)
	}
	return nil
}

// ttl checks the lifetime a node asks for. Unset means the default
// (nvmegate.GrantExpiry); a zero or negative duration is refused rather than
// read as unset, since it is not what the caller asked for.
func ttl(field string, d *durationpb.Duration) error {
	if d == nil {
		return nil
	}
	if err := d.CheckValid(); err != nil {
		return nvmegate.Invalid(field, "must be a valid duration: %v", err)
	}
	if v := d.AsDuration(); v <= 0 {
		return nvmegate.Invalid(field, "must be positive (got %v); leave it unset for the default", v)
	}
	return nil
}

func timestamp(field string, t *timestamppb.Timestamp) error {
	if t == nil {
		return nil
	}
	if err := t.CheckValid(); err != nil {
		return nvmegate.Invalid(field, "must be a valid timestamp: %v", err)
	}
	return nil
}

func enum(field string, v int32, names map[int32]string) error {
	if _, ok := names[v]; !ok {
		return nvmegate.Invalid(field, "unknown value %d", v)
	}
	return nil
}

// optional applies check to v only when v is set.
func optional(check func(field, v string) error, field, v string) error {
	if v == "" {
		return nil
	}
	return check(field, v)
}

// first returns the first non-nil error.
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// reason checks the free text of a revocation, a job's end or a rotation.
// It goes into audit entries, which refuse anything that looks like a key;
// ValidateText refuses that here, with the reason why, so that the action
// is not refused later.
func reason(v string, required bool) error {
	return nvmegate.ValidateText("reason", v, required)
}
