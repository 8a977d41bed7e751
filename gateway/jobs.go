package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
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
	FinishJob(ctx context.Context, id string, gen *uint32) (j *nvmegate.Job, unchanged bool, err error)
	UpdateJobNodes(ctx context.Context, id string, gen *uint32, add, remove []string) (*nvmegate.Job, error)
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
	// record appends an entry to the audit log, durably: the end of a
	// job's earlier generation that an admission makes.
	record func(ctx context.Context, e audit.Entry) error
	now    func() time.Time
	log    *slog.Logger
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
	if err := s.endEarlierGeneration(ctx, j); err != nil {
		return nil, err
	}
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

// endEarlierGeneration finishes the job j's ID names if it is active at
// an earlier generation (a requeued run whose epilog did not finish it),
// and ends its grants, before j is admitted: the next run starts with
// none of the last one's access. Its entry is recorded first, apart from
// the admission's.
func (s *jobsService) endEarlierGeneration(ctx context.Context, j *nvmegate.Job) error {
	old, err := s.store.Job(ctx, j.ID)
	if nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
		return nil
	}
	if err != nil {
		return err
	}
	if old.Tenant != j.Tenant || old.Generation >= j.Generation {
		return nil // the store decides (CreateJob): another tenant's job is never ended here
	}
	why := fmt.Sprintf("job %s generation %d finished: generation %d admitted", old.ID, old.Generation, j.Generation)
	// The admission's own entry goes with the admission's write.
	ctx = store.WithCallRecord(ctx, nil)
	if old.State == nvmegate.JobActive {
		if s.record == nil {
			return nvmegate.Errorf(nvmegate.EINTERNAL, "admit: no audit log to record the end of generation %d", old.Generation)
		}
		e := audit.Entry{Kind: audit.EventJobFinish, Time: s.now(), JobID: old.ID, Tenant: old.Tenant, Caller: callerID(ctx), Detail: why}
		if err := s.record(ctx, e); err != nil {
			return err
		}
		fin, unchanged, err := s.store.FinishJob(ctx, old.ID, &old.Generation)
		if err != nil {
			return err
		}
		if unchanged && fin.Generation != old.Generation {
			return nil // a later generation landed meanwhile: its grants are its own
		}
	}
	// The next run must start with none of the last one's access, also
	// when that run ended before (its epilog finished it, or an admission
	// before this one did and then failed here): a grant that did not end
	// refuses the admission, and a retry ends it. Until the next run is
	// admitted, every grant under the ID is the last run's.
	if s.lease != nil {
		if _, err := s.lease.EndJob(ctx, old.ID, callerID(ctx), why); err != nil {
			return nvmegate.Errorf(nvmegate.EUNAVAILABLE, "generation %d of job %q is finished, but its grants did not all end (%v); retry the admission", old.Generation, old.ID, err)
		}
	}
	return nil
}

// Finish ends a job scope and its grants: the targets stop allowing its
// hosts, and the roots those hosts knew rotate. A job that ended already
// is answered as it is (its grants are ended again, in case a finish
// before was cut short); one at a later generation than the request's is
// left alone (a late epilog of an earlier run).
func (s *jobsService) Finish(ctx context.Context, r *pb.FinishRequest) (*pb.FinishResponse, error) {
	j, unchanged, err := s.store.FinishJob(ctx, r.JobId, r.Generation)
	if err != nil {
		return nil, err
	}
	out := &pb.FinishResponse{Job: jobToProto(j), Unchanged: unchanged}
	if j.State == nvmegate.JobActive {
		return out, nil // a later generation's
	}
	if s.lease != nil {
		why := "job " + j.ID + " finished"
		if j.Generation > 0 {
			why = fmt.Sprintf("job %s generation %d finished", j.ID, j.Generation)
		}
		if r.Reason != "" {
			why += ": " + r.Reason
		}
		// The job is finished whatever happens here, but a grant that
		// did not end is not a success: the same call again ends the rest
		// (the reconciler retries meanwhile).
		ids, err := s.lease.EndJob(ctx, j.ID, callerID(ctx), why)
		if err != nil {
			s.log.ErrorContext(ctx, "job finished, its grants not all ended", "job", j.ID, "err", err)
			return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "job %q is finished, but %d of its grants ended and the rest did not (%v); retry the call", j.ID, len(ids), err)
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
		ExpiresAt: ts(j.ExpiresAt), AdmittedAt: ts(j.AdmittedAt), FinishedAt: ts(j.FinishedAt), DecisionId: j.DecisionID,
		Generation: j.Generation, User: j.User}
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

// UpdateNodes adds nodes to an active job and removes others. Policy has
// decided the job with its new node set (describe.go); the removed nodes'
// grants end, and their targets stop allowing their hosts.
func (s *jobsService) UpdateNodes(ctx context.Context, r *pb.UpdateNodesRequest) (*pb.UpdateNodesResponse, error) {
	d, ok := authz.DecisionFromContext(ctx)
	if !ok {
		return nil, nvmegate.Errorf(nvmegate.EINTERNAL, "update nodes: call has no authorization")
	}
	j, err := s.store.UpdateJobNodes(ctx, r.JobId, r.Generation, r.AddNodes, r.RemoveNodes)
	if err != nil {
		return nil, err
	}
	out := &pb.UpdateNodesResponse{Job: jobToProto(j), Decision: decisionToProto(d)}
	if s.lease != nil && len(r.RemoveNodes) > 0 {
		ids, err := s.lease.EndNodes(ctx, j.ID, r.RemoveNodes, callerID(ctx), fmt.Sprintf("node left job %s", j.ID))
		out.EndedGrantIds = ids
		if err != nil {
			// The nodes are out of the job (no grant of theirs commits
			// again), but a grant of theirs did not end: not a success.
			// The same call again changes no node and ends the rest.
			s.log.ErrorContext(ctx, "nodes left the job, their grants not all ended", "job", j.ID, "err", err)
			return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "the nodes left job %q, but %d of their grants ended and the rest did not (%v); retry the call", j.ID, len(ids), err)
		}
	}
	return out, nil
}
