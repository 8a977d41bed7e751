package main

import (
	"errors"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/fabric/spdk"
	"github.com/nvmegate/nvmegate/targetagent"
)

func (a *app) targetAgentCmd() *cobra.Command {
	var nvmetRoot, spdkSocket, spdkKeyDir string
	cmd := &cobra.Command{
		Use:   "target-agent (--nvmet-root DIR | --spdk-socket SOCK --spdk-key-dir DIR)",
		Short: "Run the target agent of this storage server: stream its desired state from the gateway, apply it, acknowledge",
		Long: `Run on each storage server, with the target's own SVID
(spiffe://<td>/target/<target id>). The agent streams its target's desired state
from the gateway — the hosts allowed on its subsystems with their keys, and
nothing of any other target — applies each generation with the local driver
(Linux nvmet configfs, normally /sys/kernel/config/nvmet, or an SPDK nvmf_tgt),
and acknowledges it; the gateway answers a Connect only after that. It
reconnects with backoff when the gateway restarts. Stop it with SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var d fabric.Driver
			switch {
			case nvmetRoot != "" && spdkSocket == "":
				d = &nvmet.Driver{Root: nvmetRoot}
			case spdkSocket != "" && spdkKeyDir != "" && nvmetRoot == "":
				d = &spdk.Driver{Socket: spdkSocket, KeyDir: spdkKeyDir}
			default:
				return errors.New("give --nvmet-root, or --spdk-socket with --spdk-key-dir")
			}
			conn, err := a.dial(cmd.Context())
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(a.stderr, nil))
			log.Info("target agent running")
			r := &targetagent.Remote{Conn: conn, Driver: d, Log: log, Applied: func(gen uint64, err error) {
				if err == nil {
					log.Info("applied", "generation", gen)
				}
			}}
			return r.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&nvmetRoot, "nvmet-root", "", "the nvmet configfs root (e.g. /sys/kernel/config/nvmet)")
	cmd.Flags().StringVar(&spdkSocket, "spdk-socket", "", "the SPDK JSON-RPC socket (e.g. /var/tmp/spdk.sock)")
	cmd.Flags().StringVar(&spdkKeyDir, "spdk-key-dir", "", "absolute directory for SPDK key files")
	return cmd
}
