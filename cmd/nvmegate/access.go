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
			if ttl > 0 {
				req.Ttl = durationpb.New(ttl)
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
					fmt.Fprintf(a.stdout, "nvme connect %s\n", strings.Join(resp.ConnectArgs, " "))
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.JobId, "job", "", "the job whose scope names this node")
	f.StringVar(&req.SubsystemNqn, "subsystem", "", "the subsystem to connect to")
	f.StringVar(&req.HostNqn, "host-nqn", "", "the host NQN to use (default: the one bound to this node)")
	f.DurationVar(&ttl, "ttl", 0, "how long the grant should last (capped by policy and the job)")
	f.StringVar(&writeConfig, "write-config", "", "write the libnvme config.json (with the secrets) to FILE")
	f.BoolVar(&printConnect, "print-connect", false, "print the nvme connect command line (with the secrets)")
	cmd.MarkFlagRequired("job")
	cmd.MarkFlagRequired("subsystem")
	return cmd
}
