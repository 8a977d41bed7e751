package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) discoverCmd() *cobra.Command {
	var job string
	cmd := &cobra.Command{
		Use:   "discover --job JOB_ID",
		Short: "List where a job's subsystems listen, and the host NQN to connect with (nodes)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).Discover(ctx, &pb.DiscoverRequest{JobId: job})
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Entries))
				for _, e := range resp.Entries {
					rows = append(rows, []string{e.Subnqn, e.Trtype, e.Adrfam, e.Traddr, e.Trsvcid, fmt.Sprint(e.Portid), e.Treq, e.Sectype})
				}
				if a.output != "json" {
					fmt.Fprintf(a.stdout, "host NQN: %s\n", resp.HostNqn)
				}
				return a.print(resp, []string{"SUBSYSTEM", "TRTYPE", "ADRFAM", "TRADDR", "TRSVCID", "PORT", "TREQ", "SECTYPE"}, rows)
			})
		},
	}
	cmd.Flags().StringVar(&job, "job", "", "the job whose scope names this node")
	cmd.MarkFlagRequired("job")
	return cmd
}

func (a *app) connectCmd() *cobra.Command {
	var (
		req          pb.ConnectRequest
		ttl          time.Duration
		writeConfig  string
		printConnect bool
	)
	cmd := &cobra.Command{
		Use:   "connect --job JOB_ID --subsystem NQN [--ttl D] [--write-config FILE] [--print-connect]",
		Short: "Get a grant and credentials for one subsystem of a job (nodes)",
		Long: `Ask the gateway for access to one subsystem of a job. The gateway checks the
policy, derives DH-HMAC-CHAP secrets (and a TLS PSK where required) for this
node's bound host NQN, programs the target to accept them, records the grant in
the audit log, and only then answers.

The secrets are not printed unless asked for: --write-config writes the libnvme
config.json for "nvme connect-all -J FILE" (mode 0600), --print-connect prints
the "nvme connect" command line, -o json prints the whole answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Ttl, err = ttlProto(cmd, ttl); err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).Connect(ctx, &req)
				if err != nil {
					return err
				}
				if writeConfig != "" {
					if err := os.WriteFile(writeConfig, resp.ConfigJson, 0o600); err != nil {
						return err
					}
				}
				if a.output == "json" {
					return a.print(resp, nil, nil)
				}
				g := resp.Grant
				if err := a.print(resp, []string{"GRANT", "HOST NQN", "SUBSYSTEM", "KEY", "EXPIRES", "AUDIT"},
					[][]string{{g.GrantId, g.HostNqn, g.SubsystemNqn, fmt.Sprintf("v%d", g.KeyVersion), tsString(g.ExpiresAt), fmt.Sprint(g.AuditIndex)}}); err != nil {
					return err
				}
				if writeConfig != "" {
					fmt.Fprintf(a.stdout, "config.json with the credentials written to %s (0600)\n", writeConfig)
				}
				if printConnect {
					fmt.Fprintf(a.stdout, "nvme connect %s\n", shellJoin(resp.ConnectArgs))
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.JobId, "job", "", "the job whose scope names this node")
	f.StringVar(&req.SubsystemNqn, "subsystem", "", "the subsystem to connect to")
	f.StringVar(&req.HostNqn, "host-nqn", "", "the host NQN to use (default: the one bound to this node)")
	f.DurationVar(&ttl, "ttl", 0, "how long the grant should last, more than 0 (default: the gateway's; capped by policy and the job)")
	f.StringVar(&writeConfig, "write-config", "", "write the libnvme config.json (with the secrets) to FILE")
	f.BoolVar(&printConnect, "print-connect", false, "print the nvme connect command line (with the secrets)")
	cmd.MarkFlagRequired("job")
	cmd.MarkFlagRequired("subsystem")
	return cmd
}

// ttlProto is the ttl of a Connect or Renew request: nil (the gateway's
// default) when --ttl was not given, the duration when it is positive. A
// zero or negative --ttl is refused: sent as nothing it would silently
// become the default, which is not what was asked for.
func ttlProto(cmd *cobra.Command, ttl time.Duration) (*durationpb.Duration, error) {
	if !cmd.Flags().Changed("ttl") {
		return nil, nil
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("--ttl must be positive (got %v); leave it out for the gateway's default", ttl)
	}
	return durationpb.New(ttl), nil
}

var grantHeader = []string{"GRANT", "JOB", "NODE", "HOST NQN", "SUBSYSTEM", "KEY", "STATE", "EXPIRES"}

func grantRow(g *pb.Grant) []string {
	state := strings.ToLower(strings.TrimPrefix(g.State.String(), "GRANT_STATE_"))
	if g.SupersededBy != "" {
		state += " (superseded by " + g.SupersededBy + ")"
	}
	if g.RemovalPending {
		// Ended in the store, still on the target: say so where it is read.
		state += " (removal pending)"
	}
	return []string{g.GrantId, g.JobId, g.Node, g.HostNqn, g.SubsystemNqn, fmt.Sprintf("v%d", g.KeyVersion), state, tsString(g.ExpiresAt)}
}

func (a *app) renewCmd() *cobra.Command {
	var (
		ttl          time.Duration
		writeConfig  string
		printConnect bool
	)
	cmd := &cobra.Command{
		Use:   "renew GRANT_ID [--ttl D] [--write-config FILE] [--print-connect]",
		Short: "Extend a grant; after a key rotation it returns the new credentials (nodes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.RenewRequest{GrantId: args[0]}
			var err error
			if req.Ttl, err = ttlProto(cmd, ttl); err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).Renew(ctx, req)
				if err != nil {
					return err
				}
				if writeConfig != "" {
					if err := os.WriteFile(writeConfig, resp.ConfigJson, 0o600); err != nil {
						return err
					}
				}
				if err := a.print(resp, grantHeader, [][]string{grantRow(resp.Grant)}); err != nil || a.output == "json" {
					return err
				}
				if printConnect {
					fmt.Fprintf(a.stdout, "nvme connect %s\n", shellJoin(resp.ConnectArgs))
				}
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "new lifetime from now, more than 0 (default: the gateway's; capped by policy and the job)")
	cmd.Flags().StringVar(&writeConfig, "write-config", "", "write the libnvme config.json with the current credentials")
	cmd.Flags().BoolVar(&printConnect, "print-connect", false, "print the nvme connect command line (with the secrets)")
	return cmd
}

func (a *app) releaseCmd() *cobra.Command {
	return &cobra.Command{
		Use: "release GRANT_ID", Short: "End a grant: the target stops allowing the host (nodes)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).Release(ctx, &pb.ReleaseRequest{GrantId: args[0]})
				if err != nil {
					return err
				}
				return a.print(resp, grantHeader, [][]string{grantRow(resp.Grant)})
			})
		},
	}
}

func (a *app) grantsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "grants", Short: "List grants (admins)"}
	var (
		req   pb.ListGrantsRequest
		state string
		page  pageFlags
	)
	list := &cobra.Command{
		Use: "list [--job J] [--node SPIFFE_ID] [--state active|released|revoked|expired] [--removal-pending]", Short: "List grants", Args: cobra.NoArgs,
		Long: `List grants. An ended grant whose target has not yet acknowledged removing
its host shows as "(removal pending)" after its state: the host may still
reach the subsystem, and the gateway keeps telling the target until it
follows. --removal-pending lists only those.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch state {
			case "":
			case "active", "released", "revoked", "expired":
				req.State = pb.GrantState(pb.GrantState_value["GRANT_STATE_"+strings.ToUpper(state)])
			default:
				return fmt.Errorf("--state must be active, released, revoked or expired, got %q", state)
			}
			req.PageSize, req.PageToken = page.size, page.token
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).ListGrants(ctx, &req)
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Grants))
				for _, g := range resp.Grants {
					rows = append(rows, grantRow(g))
				}
				return a.printPage(resp, grantHeader, rows, resp.NextPageToken)
			})
		},
	}
	list.Flags().StringVar(&req.JobId, "job", "", "only this job's grants")
	list.Flags().StringVar(&req.Node, "node", "", "only this node's grants")
	list.Flags().StringVar(&state, "state", "", "only grants in this state")
	list.Flags().BoolVar(&req.RemovalPending, "removal-pending", false, "only ended grants whose target has not removed the host yet")
	page.register(list)
	cmd.AddCommand(list)
	return cmd
}

func (a *app) revokeCmd() *cobra.Command {
	var grant, job, node, reason string
	cmd := &cobra.Command{
		Use:   "revoke (--grant ID | --job J | --node SPIFFE_ID) --reason TEXT",
		Short: "End grants now: the targets stop allowing the hosts and the roots they knew rotate (admins)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &pb.RevokeRequest{Reason: reason}
			n := 0
			if grant != "" {
				req.Selector, n = &pb.RevokeRequest_GrantId{GrantId: grant}, n+1
			}
			if job != "" {
				req.Selector, n = &pb.RevokeRequest_JobId{JobId: job}, n+1
			}
			if node != "" {
				req.Selector, n = &pb.RevokeRequest_Node{Node: node}, n+1
			}
			if n != 1 {
				return fmt.Errorf("give exactly one of --grant, --job, --node")
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAccessClient(c).Revoke(ctx, req)
				if err != nil {
					return err
				}
				if a.output == "json" {
					return a.print(resp, nil, nil)
				}
				_, err = fmt.Fprintf(a.stdout, "revoked %d grant(s): %s\n", len(resp.RevokedGrantIds), strings.Join(resp.RevokedGrantIds, " "))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&grant, "grant", "", "one grant")
	cmd.Flags().StringVar(&job, "job", "", "every active grant of a job")
	cmd.Flags().StringVar(&node, "node", "", "every active grant of a node")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the audit log")
	cmd.MarkFlagRequired("reason")
	return cmd
}

// shellJoin joins args into a line a POSIX shell splits back into args:
// an argument with a space or a shell metacharacter (a TLS PSK identity
// has spaces) is single-quoted.
func shellJoin(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=:./,+@%") == "" {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
