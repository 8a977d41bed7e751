package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/internal/clientconn"
)

// app holds the global flags and the connection shared by the commands.
type app struct {
	stdout, stderr io.Writer

	id      clientconn.Options // who to be and where the gateway is (the identity flags)
	output  string
	timeout time.Duration

	conn   *grpc.ClientConn
	source identity.Source
}

func newApp(stdout, stderr io.Writer) *app { return &app{stdout: stdout, stderr: stderr} }

func (a *app) root() *cobra.Command {
	root := &cobra.Command{
		Use:           "nvmegate",
		Short:         "Command-line client of the nvmegate gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			switch a.output {
			case "table", "json":
				return nil
			}
			return fmt.Errorf("-o must be table or json, got %q", a.output)
		},
	}
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	f := root.PersistentFlags()
	idFlags := flag.NewFlagSet("identity", flag.ContinueOnError)
	a.id.AddFlags(idFlags, "admin, acme-scheduler, acme-node-1")
	f.AddGoFlagSet(idFlags)
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&a.timeout, "timeout", 30*time.Second, "deadline of each RPC")
	root.AddCommand(a.inventoryCmd(), a.jobCmd(), a.discoverCmd(), a.connectCmd(), a.renewCmd(), a.releaseCmd(), a.grantsCmd(), a.revokeCmd(), a.policyCmd(), a.auditCmd(), a.attestCmd(), a.keysCmd(), a.hostNQNCmd(), a.benchCmd(), a.slurmCmd())
	return root
}

// dial connects to the gateway with the configured identity, once.
func (a *app) dial(ctx context.Context) (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	conn, src, err := clientconn.Dial(ctx, a.id)
	if err != nil {
		return nil, err
	}
	a.conn, a.source = conn, src
	return conn, nil
}

func (a *app) close() {
	if a.conn != nil {
		a.conn.Close()
		a.conn = nil
	}
	if a.source != nil {
		a.source.Close()
		a.source = nil
	}
}

// call runs one RPC with the configured deadline, and turns a gRPC status into
// an error that names the code and the gateway's message.
func (a *app) call(cmd *cobra.Command, fn func(ctx context.Context, conn *grpc.ClientConn) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), a.timeout)
	defer cancel()
	conn, err := a.dial(ctx)
	if err != nil {
		return err
	}
	return statusErr(fn(ctx, conn))
}

// statusErr turns a gRPC status into an error that names the code and the
// gateway's message; other errors pass through.
func statusErr(err error) error {
	if st, ok := status.FromError(err); ok && err != nil {
		return fmt.Errorf("%s: %s", st.Code(), st.Message())
	}
	return err
}
