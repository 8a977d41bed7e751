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
	cmd.AddCommand(a.jobAdmitCmd(), a.jobGetCmd(), a.jobListCmd(), a.jobFinishCmd(), a.jobNodesCmd())
	return cmd
}

var jobHeader = []string{"JOB", "GEN", "TENANT", "STATE", "NODES", "NAMESPACES", "REGIONS", "EXPIRES"}

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
	return []string{j.JobId, fmt.Sprint(j.Generation), j.Tenant, state, fmt.Sprint(len(j.Nodes)), strings.Join(nss, ","),
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
		req       pb.AdmitRequest
		nss       []string
		expires   time.Duration
		expiresAt string
	)
	cmd := &cobra.Command{
		Use:   "admit JOB_ID --tenant T (--node SPIFFE_ID... | --hostlist EXPR) --namespace NQN/NSID:ro|rw... --region R... [--expires-in 24h | --expires-at TIME]",
		Short: "Admit a job scope: which nodes may reach which namespaces, how, where, until when",
		Long: `Admit a job scope. Admitting the same job, generation and scope again answers
the job as stored, so a scheduler may retry. A requeued job is admitted again
under its ID with --generation one higher: the run before ends first.

Nodes are SPIFFE IDs, or hosts of a Slurm hostlist (--hostlist 'gpu[001-128]'),
each host h the node spiffe://<your trust domain>/node/h.`,
		Example: `  nvmegate job admit llm-pretrain-7 --tenant acme \
    --node spiffe://example.org/node/gpu-1 --node spiffe://example.org/node/gpu-2 \
    --namespace nqn.2026-01.io.example:acme-train/1:ro --region eu-west --expires-in 12h
  nvmegate job admit 4242 --generation 1 --user alice --tenant acme --hostlist 'gpu[001-128,130]' \
    --namespace nqn.2026-01.io.example:acme-train/1:ro --region eu-west --expires-at 2026-12-08T06:00:00Z`,
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
			switch {
			case expiresAt != "" && cmd.Flags().Changed("expires-in"):
				return fmt.Errorf("give --expires-in or --expires-at, not both")
			case expiresAt != "":
				at, err := time.Parse(time.RFC3339, expiresAt)
				if err != nil {
					return fmt.Errorf("--expires-at: want an RFC 3339 time such as 2026-12-08T06:00:00Z: %w", err)
				}
				// A retried admission names the same expiry: the same scope.
				req.ExpiresAt = timestamppb.New(at)
			case expires <= 0:
				return fmt.Errorf("--expires-in must be positive")
			default:
				req.ExpiresAt = timestamppb.New(time.Now().Add(expires))
			}
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
	f.StringVar(&expiresAt, "expires-at", "", "when the scope ends (RFC 3339); a retry names the same time")
	f.StringVar(&req.Hostlist, "hostlist", "", "the job's nodes as a Slurm hostlist, e.g. 'gpu[001-128,130]'")
	f.Uint32Var(&req.Generation, "generation", 0, "the job's run: 0, then one more per requeue (SLURM_JOB_RESTART_COUNT)")
	f.StringVar(&req.User, "user", "", "the user the job runs as, for the record")
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
	var (
		reason string
		gen    uint32
	)
	cmd := &cobra.Command{
		Use: "finish JOB_ID [--reason TEXT] [--generation N]", Short: "End a job scope: its access ends and the roots its hosts knew rotate",
		Long: `End a job scope. Finishing a job that has ended already answers it as it is,
so an epilog may retry. With --generation, a job at a later generation is left
alone (a late epilog of an earlier run).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.FinishRequest{JobId: args[0], Reason: reason}
			if cmd.Flags().Changed("generation") {
				req.Generation = &gen
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).Finish(ctx, req)
				if err != nil {
					return err
				}
				return a.print(resp, append(jobHeader, "UNCHANGED", "ENDED"),
					[][]string{append(jobRow(resp.Job), fmt.Sprint(resp.Unchanged), fmt.Sprint(len(resp.EndedGrantIds)))})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	cmd.Flags().Uint32Var(&gen, "generation", 0, "finish only this generation or an earlier one")
	return cmd
}

func (a *app) jobNodesCmd() *cobra.Command {
	var (
		req pb.UpdateNodesRequest
		gen uint32
	)
	cmd := &cobra.Command{
		Use:     "nodes JOB_ID [--add SPIFFE_ID...] [--remove SPIFFE_ID...] [--add-hostlist EXPR] [--remove-hostlist EXPR]",
		Short:   "Add nodes to an active job and remove others (elastic jobs): a removed node's grants end",
		Example: `  nvmegate job nodes 4242 --add-hostlist 'gpu[129-136]' --remove-hostlist gpu007`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.JobId = args[0]
			if cmd.Flags().Changed("generation") {
				req.Generation = &gen
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewJobsClient(c).UpdateNodes(ctx, &req)
				if err != nil {
					return err
				}
				return a.print(resp, append(jobHeader, "ENDED"), [][]string{append(jobRow(resp.Job), fmt.Sprint(len(resp.EndedGrantIds)))})
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&req.AddNodes, "add", nil, "SPIFFE ID of a node to add (repeat)")
	f.StringSliceVar(&req.RemoveNodes, "remove", nil, "SPIFFE ID of a node to remove (repeat)")
	f.StringVar(&req.AddHostlist, "add-hostlist", "", "nodes to add, as a Slurm hostlist")
	f.StringVar(&req.RemoveHostlist, "remove-hostlist", "", "nodes to remove, as a Slurm hostlist")
	f.Uint32Var(&gen, "generation", 0, "the generation the change is for; another is refused")
	return cmd
}
