package gateway

import (
	"context"
	"log/slog"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/lease"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// JobStore is what the Jobs service needs of the store.
type JobStore interface {
	CreateJob(ctx context.Context, j *nvmegate.Job) error
	Job(ctx context.Context, id string) (*nvmegate.Job, error)
	ListJobs(ctx context.Context, f store.JobFilter, p store.Page) ([]*nvmegate.Job, string, error)
	FinishJob(ctx context.Context, id string) (*nvmegate.Job, error)
}

// jobsService admits, reads and finishes job scopes. Policy has decided
// who may (a scheduler for its own tenant, admins); the audit interceptor
// has recorded admissions and finishes before they happen.
type jobsService struct {
	pb.UnimplementedJobsServer
	store JobStore
	// lease ends a finished job's active grants: the targets stop
	// allowing its hosts and the roots they knew rotate. Nil: the gateway
	// keeps no grants.
	lease *lease.Lifecycle
	// lineage signs the finished job's lineage attestation; nil: none.
	lineage func(ctx context.Context, jobID string) ([]byte, error)
	log     *slog.Logger
}

func (s *jobsService) Admit(ctx context.Context, r *pb.AdmitRequest) (*pb.AdmitResponse, error) {
	j, err := jobFromAdmit(r)
	if err != nil {
		return nil, err
	}
	d, ok := authz.DecisionFromContext(ctx)
	c, ok2 := authz.CallerFromContext(ctx)
	if !ok || !ok2 {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "admit: call has no authorization")
	}
	j.Scheduler, j.DecisionID = c.ID, d.ID
	j.ExpiresAt = r.ExpiresAt.AsTime()
	if err := s.store.CreateJob(ctx, j); err != nil {
		return nil, err
	}
	out := jobToProto(j)
	out.AuditIndex, _ = auditIndexFromContext(ctx)
	return &pb.AdmitResponse{Job: out, Decision: decisionToProto(d)}, nil
}

func (s *jobsService) Get(ctx context.Context, r *pb.JobsGetRequest) (*pb.JobsGetResponse, error) {
	j, err := s.store.Job(ctx, r.JobId)
	if err != nil {
		return nil, err
	}
	return &pb.JobsGetResponse{Job: jobToProto(j)}, nil
}

func (s *jobsService) List(ctx context.Context, r *pb.JobsListRequest) (*pb.JobsListResponse, error) {
	js, next, err := s.store.ListJobs(ctx, store.JobFilter{Tenant: r.Tenant, State: jobStateName(r.State)},
		store.Page{Size: int(r.PageSize), Token: r.PageToken})
	if err != nil {
		return nil, err
	}
	out := &pb.JobsListResponse{NextPageToken: next}
	for _, j := range js {
		out.Jobs = append(out.Jobs, jobToProto(j))
	}
	return out, nil
}

// Finish ends a job scope and its grants: the targets stop allowing its
// hosts, and the roots those hosts knew rotate.
func (s *jobsService) Finish(ctx context.Context, r *pb.FinishRequest) (*pb.FinishResponse, error) {
	j, err := s.store.FinishJob(ctx, r.JobId)
	if err != nil {
		return nil, err
	}
	out := &pb.FinishResponse{Job: jobToProto(j)}
	if s.lease != nil {
		why := "job " + j.ID + " finished"
		if r.Reason != "" {
			why += ": " + r.Reason
		}
		// The job is finished whatever happens here; the reconciler and
		// the scheduled rotation catch up, and failures are logged.
		ids, err := s.lease.EndJob(ctx, j.ID, callerID(ctx), why)
		if err != nil {
			s.log.ErrorContext(ctx, "job finished, its grants not all ended", "job", j.ID, "err", err)
		}
		out.EndedGrantIds = ids
	}
	if s.lineage != nil {
		// The lineage covers every entry so far, this finish's included
		// (recorded before the handler ran). A failure here does not undo
		// the finish: Audit.Lineage builds it again on demand.
		if env, err := s.lineage(ctx, j.ID); err != nil {
			s.log.ErrorContext(ctx, "job finished, lineage not signed", "job", j.ID, "err", err)
		} else {
			out.Lineage = env
		}
	}
	return out, nil
}

func jobStateName(s pb.JobState) string {
	switch s {
	case pb.JobState_JOB_STATE_ACTIVE:
		return nvmegate.JobActive
	case pb.JobState_JOB_STATE_FINISHED:
		return nvmegate.JobFinished
	case pb.JobState_JOB_STATE_EXPIRED:
		return nvmegate.JobExpired
	}
	return ""
}

func jobToProto(j *nvmegate.Job) *pb.Job {
	out := &pb.Job{JobId: j.ID, Tenant: j.Tenant, Scheduler: j.Scheduler, Nodes: j.Nodes, AllowedRegions: j.AllowedRegions,
		ExpiresAt: ts(j.ExpiresAt), AdmittedAt: ts(j.AdmittedAt), FinishedAt: ts(j.FinishedAt), DecisionId: j.DecisionID}
	switch j.State {
	case nvmegate.JobActive:
		out.State = pb.JobState_JOB_STATE_ACTIVE
	case nvmegate.JobFinished:
		out.State = pb.JobState_JOB_STATE_FINISHED
	case nvmegate.JobExpired:
		out.State = pb.JobState_JOB_STATE_EXPIRED
	}
	for _, n := range j.Namespaces {
		m := pb.AccessMode_ACCESS_MODE_READ_ONLY
		if n.Mode == nvmegate.ModeReadWrite {
			m = pb.AccessMode_ACCESS_MODE_READ_WRITE
		}
		out.Namespaces = append(out.Namespaces, &pb.JobNamespace{SubsystemNqn: n.SubsystemNQN, Nsid: n.NSID, Mode: m})
	}
	return out
}
