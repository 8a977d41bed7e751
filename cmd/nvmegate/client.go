package main

import (
	"context"
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

	addr         string
	spiffeSocket string
	spiffeID     string
	cert, key    string
	bundle       string
	devDir       string
	devIdentity  string
	serverID     string
	output       string
	timeout      time.Duration

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
	f.StringVar(&a.addr, "addr", "", "gateway address host:port (default 127.0.0.1:7443, or the dev gateway's)")
	f.StringVar(&a.spiffeSocket, "spiffe-socket", "", "SPIFFE Workload API address for this client's SVID")
	f.StringVar(&a.spiffeID, "spiffe-id", "", "this client's SPIFFE ID, when the Workload API offers several SVIDs")
	f.StringVar(&a.cert, "cert", "", "SVID certificate chain (PEM)")
	f.StringVar(&a.key, "key", "", "SVID private key (PEM)")
	f.StringVar(&a.bundle, "bundle", "", "trust bundle (PEM)")
	f.StringVar(&a.devDir, "dev-dir", "", "dev trust domain directory (from nvmegated dev)")
	f.StringVar(&a.devIdentity, "dev-identity", "", "dev identity name, e.g. admin, acme-scheduler, acme-node-1")
	f.StringVar(&a.serverID, "server-id", "", "required SPIFFE ID of the gateway (default: any spiffe://<td>/gateway/... of the client's trust domain)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&a.timeout, "timeout", 30*time.Second, "deadline of each RPC")
	root.AddCommand(a.inventoryCmd(), a.jobCmd(), a.discoverCmd(), a.connectCmd(), a.renewCmd(), a.releaseCmd(), a.grantsCmd(), a.revokeCmd(), a.policyCmd(), a.auditCmd(), a.attestCmd(), a.keysCmd(), a.hostNQNCmd(), a.benchCmd())
	return root
}

// dial connects to the gateway with the configured identity, once.
func (a *app) dial(ctx context.Context) (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	conn, src, err := clientconn.Dial(ctx, clientconn.Options{Addr: a.addr, SPIFFESocket: a.spiffeSocket, SPIFFEID: a.spiffeID, Cert: a.cert, Key: a.key,
		Bundle: a.bundle, DevDir: a.devDir, DevIdentity: a.devIdentity, ServerID: a.serverID})
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
