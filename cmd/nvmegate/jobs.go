package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) jobCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Admit, read and finish training job scopes (schedulers)"}
	cmd.AddCommand(a.jobAdmitCmd(), a.jobGetCmd(), a.jobListCmd(), a.jobFinishCmd())
	return cmd
}

var jobHeader = []string{"JOB", "TENANT", "STATE", "NODES", "NAMESPACES", "REGIONS", "EXPIRES"}

func jobRow(j *pb.Job) []string {
	var nss []string
	for _, n := range j.Namespaces {
		mode := "ro"
		if n.Mode == pb.AccessMode_ACCESS_MODE_READ_WRITE {
			mode = "rw"
		}
		nss = append(nss, fmt.Sprintf("%s/%d:%s", n.SubsystemNqn, n.Nsid, mode))
	}
	state := strings.ToLower(strings.TrimPrefix(j.State.String(), "JOB_STATE_"))
	return []string{j.JobId, j.Tenant, state, fmt.Sprint(len(j.Nodes)), strings.Join(nss, ","),
		strings.Join(j.AllowedRegions, ","), tsString(j.ExpiresAt)}
}

// parseJobNamespace reads "NQN/NSID:ro|rw".
func parseJobNamespace(s string) (*pb.JobNamespace, error) {
	// NQNs contain ':': the mode is after the last one.
	c := strings.LastIndexByte(s, ':')
	if c < 0 {
		return nil, fmt.Errorf("%q: want NQN/NSID:ro or NQN/NSID:rw", s)
	}
	spec, mode := s[:c], s[c+1:]
	i := strings.LastIndexByte(spec, '/')
	if i < 0 {
		return nil, fmt.Errorf("%q: want NQN/NSID:ro or NQN/NSID:rw", s)
	}
	nsid, err := parseNSID(spec[i+1:])
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	out := &pb.JobNamespace{SubsystemNqn: spec[:i], Nsid: nsid}
	switch mode {
	case "ro":
		out.Mode = pb.AccessMode_ACCESS_MODE_READ_ONLY
	case "rw":
		out.Mode = pb.AccessMode_ACCESS_MODE_READ_WRITE
	default:
		return nil, fmt.Errorf("%q: mode must be ro or rw", s)
	}
	return out, nil
}

func (a *app) jobAdmitCmd() *cobra.Command {
	var (
		req     pb.AdmitRequest
		nss     []string
		expires time.Duration
	)
	cmd := &cobra.Command{
		Use:   "admit JOB_ID --tenant T --node SPIFFE_ID... --namespace NQN/NSID:ro|rw... --region R... [--expires-in 24h]",
		Short: "Admit a job scope: which nodes may reach which namespaces, how, where, until when",
		Example: `  nvmegate job admit llm-pretrain-7 --tenant acme \
    --node spiffe://example.org/node/gpu-1 --node spiffe://example.org/node/gpu-2 \
    --namespace nqn.2026-01.io.example:acme-train/1:ro --region eu-west --expires-in 12h`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.JobId = args[0]
			req.Namespaces = nil
			for _, s := range nss {
				n, err := parseJobNamespace(s)
				if err != nil {
					return fmt.Errorf("--namespace %w", err)
				}
				req.Namespaces = append(req.Namespaces, n)
			}
			if expires <= 0 {
				return fmt.Errorf("--expires-in must be positive")
			}
			req.ExpiresAt = timestamppb.New(time.Now().Add(expires))
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).Admit(ctx, &req)
				if err != nil {
					return err
				}
				return a.print(resp, append(jobHeader, "DECISION", "AUDIT"),
					[][]string{append(jobRow(resp.Job), resp.Decision.GetId(), fmt.Sprint(resp.Job.AuditIndex))})
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Tenant, "tenant", "", "the tenant the job runs for")
	f.StringSliceVar(&req.Nodes, "node", nil, "SPIFFE ID of a node of the job (repeat)")
	f.StringSliceVar(&nss, "namespace", nil, "NQN/NSID:ro or NQN/NSID:rw (repeat)")
	f.StringSliceVar(&req.AllowedRegions, "region", nil, "a region the job's data may be read in (repeat)")
	f.DurationVar(&expires, "expires-in", 24*time.Hour, "how long the scope lasts")
	cmd.MarkFlagRequired("tenant")
	return cmd
}

func (a *app) jobGetCmd() *cobra.Command {
	return &cobra.Command{
		Use: "get JOB_ID", Short: "Show a job scope", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).Get(ctx, &pb.JobsGetRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				return a.print(resp, jobHeader, [][]string{jobRow(resp.Job)})
			})
		},
	}
}

func (a *app) jobListCmd() *cobra.Command {
	var (
		req   pb.JobsListRequest
		state string
		page  pageFlags
	)
	cmd := &cobra.Command{
		Use: "list [--tenant T] [--state active|finished|expired]", Short: "List job scopes", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch state {
			case "":
			case "active":
				req.State = pb.JobState_JOB_STATE_ACTIVE
			case "finished":
				req.State = pb.JobState_JOB_STATE_FINISHED
			case "expired":
				req.State = pb.JobState_JOB_STATE_EXPIRED
			default:
				return fmt.Errorf("--state must be active, finished or expired, got %q", state)
			}
			req.PageSize, req.PageToken = page.size, page.token
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).List(ctx, &req)
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Jobs))
				for _, j := range resp.Jobs {
					rows = append(rows, jobRow(j))
				}
				return a.printPage(resp, jobHeader, rows, resp.NextPageToken)
			})
		},
	}
	cmd.Flags().StringVar(&req.Tenant, "tenant", "", "only this tenant's jobs (schedulers must give their own)")
	cmd.Flags().StringVar(&state, "state", "", "only jobs in this state")
	page.register(cmd)
	return cmd
}

func (a *app) jobFinishCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use: "finish JOB_ID [--reason TEXT]", Short: "End a job scope: its access ends and the roots its hosts knew rotate",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).Finish(ctx, &pb.FinishRequest{JobId: args[0], Reason: reason})
				if err != nil {
					return err
				}
				return a.print(resp, jobHeader, [][]string{jobRow(resp.Job)})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	return cmd
}
