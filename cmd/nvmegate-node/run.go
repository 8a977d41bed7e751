package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/keyring"
	"github.com/nvmegate/nvmegate/nodeagent"
	"github.com/nvmegate/nvmegate/nvmehost"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func runCmd(stderr io.Writer) *cobra.Command {
	var (
		o       clientconn.Options
		a       nodeagent.Agent
		ring    string
		socket  string
		fabrics string
		class   string
	)
	cmd := &cobra.Command{
		Use:   "run --job JOB_ID [identity flags]",
		Short: "Connect the job's subsystems, keep them renewed and re-keyed, release them at the end",
		Long: `Discover the subsystems the job lets this node reach, take a grant for each,
put its TLS PSK (if any) in the node's keyring, and connect through the
kernel (/dev/nvme-fabrics). Renew every --renew-every; after a rotation, hand
the live controllers the new DH-HMAC-CHAP secrets (the kernel re-authenticates
in place, no disconnect) and replace the PSK for later reconnects. When the
job's grants end, disconnect and exit 0; on SIGTERM, disconnect, remove the
keys and release the grants (exit 1 if one of those did not happen).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(stderr, nil))
			if a.RenewEvery < 0 || a.TTL < 0 {
				return errors.New("--renew-every and --ttl must not be negative")
			}
			conn, src, err := clientconn.Dial(cmd.Context(), o)
			if err != nil {
				return err
			}
			defer src.Close()
			defer conn.Close()
			a.Gateway = pb.NewAccessClient(conn)
			a.Kernel = &nvmehost.Host{Fabrics: fabrics, Class: class}
			a.Log = log
			if ring != "" {
				if r, err := keyring.Named(ring); err == nil {
					a.Keys = r
				} else {
					log.Warn("no keyring for TLS PSKs: grants that require TLS will fail", "keyring", ring, "err", err)
				}
			}
			stop, err := serveStatus(socket, &a, log)
			if err != nil {
				return err
			}
			defer stop()
			log.Info("node agent running", "job", a.Job, "status", socket)
			err = a.Run(cmd.Context())
			if errors.Is(err, nodeagent.ErrJobEnded) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	identityFlags(cmd, &o)
	f.StringVar(&a.Job, "job", "", "the training job whose subsystems to connect")
	f.DurationVar(&a.TTL, "ttl", 0, "lifetime asked for each grant (default: the gateway's; capped by policy and the job)")
	f.DurationVar(&a.RenewEvery, "renew-every", time.Minute, "renewal interval; shorter than the gateway's rotation grace")
	f.StringVar(&ring, "keyring", "nvmegate-node", "the keyring (in root's user keyring) for the TLS PSKs ('' for none: TLS grants fail)")
	f.StringVar(&socket, "status-socket", defaultSocket, "unix socket for the status command ('' for none)")
	f.StringVar(&fabrics, "fabrics-dev", "/dev/nvme-fabrics", "the kernel's fabrics control device")
	f.StringVar(&class, "sysfs-class", "/sys/class/nvme", "the kernel's NVMe controller class directory")
	cmd.MarkFlagRequired("job")
	return cmd
}

func identityFlags(cmd *cobra.Command, o *clientconn.Options) {
	fs := flag.NewFlagSet("identity", flag.ContinueOnError)
	o.AddFlags(fs, "acme-node-1")
	cmd.Flags().AddGoFlagSet(fs)
}

// serveStatus serves the agent's status on a unix socket only root (the
// socket's owner) may reach; stop closes it and removes the socket.
func serveStatus(path string, a *nodeagent.Agent, log *slog.Logger) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("status socket %s: another agent is running", path)
	}
	os.Remove(path) // a stale socket of an agent that died
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("status socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("status socket: %w", err)
	}
	srv := &http.Server{Handler: a.StatusHandler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status socket", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		os.Remove(path)
	}, nil
}
