package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/lineage"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) attestCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "attest", Short: "Get and verify signed lineage attestations of jobs (auditors)"}
	var job string
	get := &cobra.Command{
		Use:   "lineage --job JOB_ID > FILE",
		Short: "Write a job's lineage attestation (DSSE envelope around an in-toto statement) to stdout",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewAuditClient(c).Lineage(ctx, &pb.LineageRequest{JobId: job})
				if err != nil {
					return err
				}
				_, err = a.stdout.Write(append(resp.Envelope, '\n'))
				return err
			})
		},
	}
	get.Flags().StringVar(&job, "job", "", "the job")
	get.MarkFlagRequired("job")

	var keyFiles []string
	verify := &cobra.Command{
		Use:   "verify FILE --key FILE [--key FILE...]",
		Short: "Verify a lineage attestation offline: its signature, the checkpoint's, every inclusion proof",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			keys, err := checkpointKeys(keyFiles)
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return errors.New("--key is required: verification trusts only the keys you give")
			}
			env, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			rep, err := lineage.Verify(env, keys)
			if err != nil {
				return fmt.Errorf("verification failed: %w", err)
			}
			if a.output == "json" {
				return json.NewEncoder(a.stdout).Encode(rep)
			}
			_, err = fmt.Fprintf(a.stdout, "job:       %s (tenant %s)\ndatasets:  %s\nentries:   %d, each proved in the signed log (tree size %d)\nsigned by: %s\nresult:    OK\n",
				rep.Job, rep.Tenant, strings.Join(rep.Datasets, ", "), rep.Entries, rep.TreeSize, rep.SignedBy)
			return err
		},
	}
	verify.Flags().StringSliceVar(&keyFiles, "key", nil, "public key of the log (v<N>.pem from an export's keys/)")
	cmd.AddCommand(get, verify)
	return cmd
}
