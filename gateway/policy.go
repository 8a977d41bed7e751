package gateway

import (
	"context"
	"encoding/json"
	"maps"
	"slices"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/lease"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// PolicyInfo reports on the loaded policy and dry-runs inputs against it.
type PolicyInfo interface {
	Status() authz.Status
	// Explain evaluates input exactly as given, against the live policy or,
	// when candidate is non-empty, the live bundle with those modules added
	// or replaced. It returns the decision and the raw decision document.
	Explain(ctx context.Context, input map[string]any, candidate map[string]string) (*nvmegate.Decision, []byte, error)
	// Candidate prepares a whole candidate policy without loading it and
	// returns an authorizer deciding by it, and its status.
	Candidate(ctx context.Context, files map[string][]byte) (authz.Authorizer, authz.Status, error)
}

// policyService implements the Policy service for security admins.
type policyService struct {
	pb.UnimplementedPolicyServer
	info     PolicyInfo
	redecide func(ctx context.Context, c Change, a authz.Authorizer, dryRun bool) (*Redecision, error)
}

// Impact re-decides the active grants under a candidate, as a dry run.
func (s *policyService) Impact(ctx context.Context, r *pb.ImpactRequest) (*pb.ImpactResponse, error) {
	if s.info == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "no policy engine is configured")
	}
	a, st, err := s.info.Candidate(ctx, r.CandidateFiles)
	if err != nil {
		return nil, err
	}
	d, err := s.redecide(ctx, Change{All: true, Cause: "impact of candidate revision " + st.Revision}, a, true)
	if err != nil {
		return nil, err
	}
	out := &pb.ImpactResponse{CandidateRevision: st.Revision, ServingRevision: s.info.Status().Revision,
		Checked: uint32(d.Checked), DataRevision: d.DataRevision}
	jobs := map[string]bool{}
	add := func(vs []lease.Verdict, outcome string) {
		for _, v := range vs {
			g := v.Grant
			out.Grants = append(out.Grants, &pb.ImpactedGrant{GrantId: g.ID, JobId: g.JobID, Tenant: g.Tenant, Node: g.Node,
				SubsystemNqn: g.SubsystemNQN, Outcome: outcome, Reasons: v.Reasons()})
			jobs[g.JobID] = true
		}
	}
	add(d.Ending, "revoke")
	add(d.Tightening, "must_renew")
	out.Jobs = slices.Sorted(maps.Keys(jobs))
	return out, nil
}

func (s *policyService) Status(context.Context, *pb.PolicyStatusRequest) (*pb.PolicyStatusResponse, error) {
	if s.info == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "no policy engine is configured")
	}
	st := s.info.Status()
	return &pb.PolicyStatusResponse{Revision: st.Revision, Source: st.Source, LoadedAt: ts(st.LoadedAt), Modules: st.Modules}, nil
}

func (s *policyService) Explain(ctx context.Context, r *pb.ExplainRequest) (*pb.ExplainResponse, error) {
	if s.info == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "no policy engine is configured")
	}
	var input map[string]any
	if err := json.Unmarshal(r.InputJson, &input); err != nil {
		return nil, nvmegate.Invalid("input_json", "must be a JSON object: %v", err)
	}
	d, raw, err := s.info.Explain(ctx, input, r.CandidateModules)
	if err != nil {
		return nil, err
	}
	return &pb.ExplainResponse{Decision: decisionToProto(d), DecisionJson: raw}, nil
}

func decisionToProto(d *nvmegate.Decision) *pb.Decision {
	if d == nil {
		return nil
	}
	o := d.Obligations
	p := &pb.Decision{
		Id: d.ID, Allow: d.Allow, Reasons: d.Reasons, PolicyRevision: d.PolicyRevision, EvaluatedAt: ts(d.EvaluatedAt),
		Obligations: &pb.Obligations{
			RequireTls: o.RequireTLS, AuthMode: o.AuthMode, MinHash: o.MinHash, MinDhGroup: o.MinDHGroup,
			Bidirectional: o.Bidirectional, ReadOnly: o.ReadOnly, MaxIops: o.MaxIOPS, MaxMbps: o.MaxMBps,
		},
	}
	if o.MaxTTL > 0 {
		p.Obligations.MaxTtl = durationpb.New(o.MaxTTL)
	}
	return p
}
