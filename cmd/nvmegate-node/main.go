// Command nvmegate-node is the node agent of a GPU node: for one training
// job it connects the node to every subsystem the job lets it reach, with
// the node's SPIFFE identity, and keeps those connections keyed until the
// job ends (package nodeagent).
//
//	nvmegate-node run --job train-42 --spiffe-socket unix:///run/spire/agent.sock --addr gw:7443
//	nvmegate-node status
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	root := newRoot(os.Stdout, os.Stderr)
	if args := nodeHookArgs(os.Args[0]); args != nil {
		root.SetArgs(args) // run as a Slurm hook (slurm.go)
	}
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

// defaultSocket is where run serves its status and status reads it.
const defaultSocket = "/run/nvmegate-node/status.sock"

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "nvmegate-node",
		Short:         "Connect this node to a job's NVMe-oF subsystems and keep them keyed",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(runCmd(stderr), statusCmd(stdout), slurmCmd(stdout))
	return root
}
