package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

func (a *app) hostNQNCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "hostnqn SPIFFE_ID",
		Short: "Print the host NQN derived from a node's SPIFFE ID (offline)",
		Long: `Print the default host NQN of a node: nqn.2014-08.org.nvmexpress:uuid:<UUIDv5 of
the SPIFFE ID>. Nodes without an explicit host binding use it. Needs no gateway.`,
		Example: "  nvmegate hostnqn spiffe://example.org/node/gpu-17",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			nqn, err := nvmefmt.HostNQNFromSPIFFEID(args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return writeJSON(a.stdout, map[string]string{"spiffe_id": args[0], "hostnqn": nqn, "hostid": nvmefmt.HostID(nqn)})
			}
			_, err = fmt.Fprintln(a.stdout, nqn)
			return err
		},
	}
}
