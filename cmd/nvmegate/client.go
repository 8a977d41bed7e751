package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
)

// app holds the global flags and the connection shared by the commands.
type app struct {
	stdout, stderr io.Writer

	addr         string
	spiffeSocket string
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
	f.StringVar(&a.cert, "cert", "", "SVID certificate chain (PEM)")
	f.StringVar(&a.key, "key", "", "SVID private key (PEM)")
	f.StringVar(&a.bundle, "bundle", "", "trust bundle (PEM)")
	f.StringVar(&a.devDir, "dev-dir", "", "dev trust domain directory (from nvmegated dev)")
	f.StringVar(&a.devIdentity, "dev-identity", "", "dev identity name, e.g. admin, acme-scheduler, acme-node-1")
	f.StringVar(&a.serverID, "server-id", "", "required SPIFFE ID of the gateway (default: any spiffe://<td>/gateway/... of the client's trust domain)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.DurationVar(&a.timeout, "timeout", 30*time.Second, "deadline of each RPC")
	root.AddCommand(a.inventoryCmd(), a.jobCmd(), a.discoverCmd(), a.connectCmd(), a.renewCmd(), a.releaseCmd(), a.grantsCmd(), a.revokeCmd(), a.targetAgentCmd(), a.policyCmd(), a.auditCmd(), a.attestCmd(), a.keysCmd(), a.hostNQNCmd())
	return root
}

// dial connects to the gateway with the configured identity, once.
func (a *app) dial(ctx context.Context) (*grpc.ClientConn, error) {
	if a.conn != nil {
		return a.conn, nil
	}
	cert, key, bundle, addr := a.cert, a.key, a.bundle, a.addr
	if a.devDir != "" || a.devIdentity != "" {
		if a.devDir == "" || a.devIdentity == "" {
			return nil, errors.New("--dev-dir and --dev-identity go together")
		}
		if cert != "" || key != "" || bundle != "" || a.spiffeSocket != "" {
			return nil, errors.New("--dev-identity excludes --cert/--key/--bundle/--spiffe-socket")
		}
		cert, key = devca.SVIDPaths(a.devDir, a.devIdentity)
		bundle = devca.BundlePath(a.devDir)
		if addr == "" {
			var err error
			if addr, err = readyAddr(devca.ReadyPath(a.devDir)); err != nil {
				return nil, err
			}
		}
	}
	if addr == "" {
		addr = "127.0.0.1:7443"
	}
	var err error
	switch {
	case a.spiffeSocket != "":
		a.source, err = identity.NewWorkloadSource(ctx, a.spiffeSocket)
	case cert != "" && key != "" && bundle != "":
		if _, statErr := os.Stat(cert); statErr != nil && a.devIdentity != "" {
			return nil, fmt.Errorf("no dev identity %q in %s", a.devIdentity, a.devDir)
		}
		a.source, err = identity.NewFileSource(cert, key, bundle)
	default:
		return nil, errors.New("an identity is required: --spiffe-socket, --cert/--key/--bundle, or --dev-dir with --dev-identity")
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	authorizer, err := a.serverAuthorizer()
	if err != nil {
		return nil, err
	}
	a.conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(identity.ClientCredentials(a.source, authorizer)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return a.conn, nil
}

// serverAuthorizer decides which gateway SVIDs the client accepts: the exact
// --server-id, or any gateway (spiffe://<td>/gateway/...) of the client's own
// trust domain; never another workload of the domain.
func (a *app) serverAuthorizer() (tlsconfig.Authorizer, error) {
	if a.serverID != "" {
		id, err := spiffeid.FromString(a.serverID)
		if err != nil {
			return nil, fmt.Errorf("--server-id: %w", err)
		}
		return tlsconfig.AuthorizeID(id), nil
	}
	svid, err := a.source.GetX509SVID()
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	return identity.AuthorizeGateway(svid.ID.TrustDomain()), nil
}

func readyAddr(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no running dev gateway (%v); start one with nvmegated dev or pass --addr", err)
	}
	var info struct {
		GRPC string `json:"grpc"`
	}
	if err := json.Unmarshal(data, &info); err != nil || info.GRPC == "" {
		return "", fmt.Errorf("%s: not a gateway ready file", path)
	}
	return info.GRPC, nil
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
