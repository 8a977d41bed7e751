package gateway

import (
	"context"
	"log/slog"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
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

// Revoker is told when access ends (a job finished): the key manager
// rotates the roots the job's hosts knew.
type Revoker interface {
	Revoked(ctx context.Context, subsystemNQN, why string) error
}

// jobsService admits, reads and finishes job scopes. Policy has decided
// who may (a scheduler for its own tenant, admins); the audit interceptor
// has recorded admissions and finishes before they happen.
type jobsService struct {
	pb.UnimplementedJobsServer
	store   JobStore
	revoker Revoker // nil: nothing to rotate
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

// Finish ends a job scope and rotates the access roots of its subsystems,
// so that what its hosts were given stops working after the grace period.
func (s *jobsService) Finish(ctx context.Context, r *pb.FinishRequest) (*pb.FinishResponse, error) {
	j, err := s.store.FinishJob(ctx, r.JobId)
	if err != nil {
		return nil, err
	}
	if s.revoker != nil {
		seen := map[string]bool{}
		for _, n := range j.Namespaces {
			if seen[n.SubsystemNQN] {
				continue
			}
			seen[n.SubsystemNQN] = true
			if err := s.revoker.Revoked(ctx, n.SubsystemNQN, "job "+j.ID+" finished"); err != nil {
				// The job is finished whatever happens here; the scheduled
				// rotation will catch up. The failure is in the log.
				s.log.ErrorContext(ctx, "job finished, root rotation failed", "job", j.ID, "subsystem", n.SubsystemNQN, "err", err)
			}
		}
	}
	return &pb.FinishResponse{Job: jobToProto(j)}, nil
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
