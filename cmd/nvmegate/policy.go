package main

import (
	"context"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) policyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Inspect the gateway's Rego policy"}
	cmd.AddCommand(&cobra.Command{
		Use: "status", Short: "Show the loaded policy revision", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewPolicyClient(c).Status(ctx, &pb.PolicyStatusRequest{})
				if err != nil {
					return err
				}
				loaded := ""
				if resp.LoadedAt != nil {
					loaded = resp.LoadedAt.AsTime().Format("2006-01-02T15:04:05Z07:00")
				}
				return a.print(resp, []string{"REVISION", "SOURCE", "LOADED", "MODULES"},
					[][]string{{resp.Revision, resp.Source, loaded, strings.Join(resp.Modules, ",")}})
			})
		},
	})
	return cmd
}
