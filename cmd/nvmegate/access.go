package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

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
