// Command nvmegate-csi is nvmegate's CSI driver (package csidriver): the
// controller plugin runs as a tenant's scheduler and admits the nodes a
// volume is published to; the node plugin runs on each GPU node as the
// node and connects the volumes staged there.
//
//	nvmegate-csi controller --endpoint unix:///csi/csi.sock --spiffe-socket unix:///run/spire/agent-sockets/spire-agent.sock --region eu-west
//	nvmegate-csi node --endpoint unix:///csi/csi.sock --state-dir /var/lib/nvmegate-csi --spiffe-socket unix:///run/spire/agent-sockets/spire-agent.sock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/csidriver"
	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/keyring"
	"github.com/nvmegate/nvmegate/nvmehost"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// version is set at build time (-ldflags "-X main.version=…").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := newRoot(os.Stderr).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRoot(stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "nvmegate-csi",
		Short:         "nvmegate's CSI driver: Kubernetes attaches datasets to training pods through the gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetErr(stderr)
	root.AddCommand(controllerCmd(stderr), nodeCmd(stderr))
	return root
}

type common struct {
	conn     clientconn.Options
	endpoint string
	driver   string
}

func (c *common) flags(cmd *cobra.Command, devIdentity string) {
	fs := flag.NewFlagSet("identity", flag.ContinueOnError)
	c.conn.AddFlags(fs, devIdentity)
	cmd.Flags().AddGoFlagSet(fs)
	cmd.Flags().StringVar(&c.endpoint, "endpoint", "unix:///csi/csi.sock", "the CSI endpoint the CO calls (unix:///path)")
	cmd.Flags().StringVar(&c.driver, "driver-name", csidriver.DriverName, "the driver's name; one per tenant where tenants share a cluster (docs/kubernetes.md)")
}

// dial connects to the gateway as this process's SVID, which must be of
// role (form names it for the error).
func (c *common) dial(ctx context.Context, role, form string) (*grpc.ClientConn, spiffeid.ID, func(), error) {
	conn, src, err := clientconn.Dial(ctx, c.conn)
	if err != nil {
		return nil, spiffeid.ID{}, nil, err
	}
	closeAll := func() { conn.Close(); src.Close() }
	svid, err := src.GetX509SVID()
	if err == nil && authz.ParseCaller(svid.ID).Role != role {
		err = fmt.Errorf("this plugin runs as a %s (%s), not %s", role, form, svid.ID)
	}
	if err != nil {
		closeAll()
		return nil, spiffeid.ID{}, nil, err
	}
	return conn, svid.ID, closeAll, nil
}

func controllerCmd(stderr io.Writer) *cobra.Command {
	var (
		c        common
		regions  []string
		lifetime time.Duration
	)
	cmd := &cobra.Command{
		Use:   "controller --region REGION [identity flags]",
		Short: "Serve the Identity and Controller services, as the tenant's scheduler",
		Long: `Serve CSI's Identity and Controller services on --endpoint, calling the
gateway as the tenant's scheduler (spiffe://<td>/tenant/<tenant>/scheduler/<name>).

CreateVolume finds an existing dataset (StorageClass parameter "dataset"; the
job is the parameter "job", or <PVC namespace>.<PVC name> with the
external-provisioner's --extra-create-metadata) and answers its volume
handle <subsystem NQN>/<nsid>@<job>. ControllerPublishVolume admits the job
with the node, or adds the node to it; unpublishing the last node finishes
the job's run.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(stderr, nil))
			if len(regions) == 0 {
				return errors.New("--region is required: the regions the jobs' data may be served from")
			}
			conn, id, closeConn, err := c.dial(cmd.Context(), authz.RoleScheduler, "spiffe://<td>/tenant/<tenant>/scheduler/<name>")
			if err != nil {
				return err
			}
			defer closeConn()
			ctrl := &csidriver.Controller{Jobs: pb.NewJobsClient(conn), Inventory: pb.NewInventoryClient(conn),
				Scheduler: id, Regions: regions, Lifetime: lifetime}
			return serve(cmd.Context(), c.endpoint, log, func(s *grpc.Server) {
				csi.RegisterIdentityServer(s, &csidriver.Identity{Name: c.driver, Version: version})
				csi.RegisterControllerServer(s, ctrl)
			}, "controller", id.String())
		},
	}
	c.flags(cmd, "acme-scheduler")
	cmd.Flags().StringSliceVar(&regions, "region", nil, "a region the jobs' data may be served from (repeat, or comma-separated)")
	cmd.Flags().DurationVar(&lifetime, "job-lifetime", 7*24*time.Hour, "how long a job's admission lasts from its first publish")
	return cmd
}

func nodeCmd(stderr io.Writer) *cobra.Command {
	var (
		c       common
		n       csidriver.Node
		ring    string
		fabrics string
		class   string
	)
	cmd := &cobra.Command{
		Use:   "node --state-dir DIR [identity flags]",
		Short: "Serve the Identity and Node services, as this node",
		Long: `Serve CSI's Identity and Node services on --endpoint, calling the gateway as
this node (spiffe://<td>/node/<host>), whose SPIFFE ID is the node ID the CO
publishes volumes to.

NodeStageVolume connects the volume's namespace with the node's own grant
(DH-HMAC-CHAP and TLS as the grant says; the TLS PSK in --keyring), returns
once its block device is there, and renews the grant while the volume stays
staged. NodePublishVolume bind-mounts the device at the pod's path.
NodeUnstageVolume disconnects and releases. The staged volumes are kept in
--state-dir: a restarted plugin connects them again (the live controllers
are taken over, the pods' devices stay).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(stderr, nil))
			if n.StateDir == "" {
				return errors.New("--state-dir is required")
			}
			conn, id, closeConn, err := c.dial(cmd.Context(), authz.RoleNode, "spiffe://<td>/node/<host>")
			if err != nil {
				return err
			}
			defer closeConn()
			n.NodeID, n.Gateway, n.Log = id.String(), pb.NewAccessClient(conn), log
			n.Kernel = &nvmehost.Host{Fabrics: fabrics, Class: class}
			n.Mounter = csidriver.HostMounter{}
			if ring != "" {
				if r, err := keyring.Named(ring); err == nil {
					n.Keys = r
				} else {
					log.Warn("no keyring for TLS PSKs: grants that require TLS will fail", "keyring", ring, "err", err)
				}
			}
			resume, err := n.Resume(cmd.Context())
			if err != nil {
				return fmt.Errorf("the staged volumes in %s: %w", n.StateDir, err)
			}
			go resume()
			return serve(cmd.Context(), c.endpoint, log, func(s *grpc.Server) {
				csi.RegisterIdentityServer(s, &csidriver.Identity{Name: c.driver, Version: version})
				csi.RegisterNodeServer(s, &n)
			}, "node", id.String())
		},
	}
	c.flags(cmd, "acme-node-1")
	f := cmd.Flags()
	f.StringVar(&n.StateDir, "state-dir", "/var/lib/nvmegate-csi", "where the staged volumes are kept")
	f.StringVar(&n.PathRoot, "path-root", "/var/lib/kubelet", "the only tree staging and target paths may name ('' for any)")
	f.DurationVar(&n.ConnectTimeout, "connect-timeout", time.Minute, "how long a stage waits for the volume's block device")
	f.DurationVar(&n.RenewEvery, "renew-every", time.Minute, "grant renewal interval; shorter than the gateway's rotation grace")
	f.DurationVar(&n.TTL, "ttl", 0, "lifetime asked for each grant (default: the gateway's)")
	f.StringVar(&ring, "keyring", "nvmegate-node", "the keyring (in root's user keyring) for the TLS PSKs ('' for none: TLS grants fail)")
	f.StringVar(&fabrics, "fabrics-dev", "/dev/nvme-fabrics", "the kernel's fabrics control device")
	f.StringVar(&class, "sysfs-class", "/sys/class/nvme", "the kernel's NVMe controller class directory")
	return cmd
}

// serve serves the CSI services on a unix socket until ctx ends. The node
// plugin leaves its connections up when it stops: pods keep their devices
// through a plugin's restart, which takes the volumes back (Resume), and a
// plugin that does not come back lets the grants lapse at their expiry.
func serve(ctx context.Context, endpoint string, log *slog.Logger, register func(*grpc.Server), mode, id string) error {
	path, err := socketPath(endpoint)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	// The CO is root (the kubelet) or the sidecars, which run as the
	// plugin's own user: no one else may ask for a stage or a bind mount.
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return err
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(logCalls(log)))
	register(s)
	go func() {
		<-ctx.Done()
		s.GracefulStop()
	}()
	log.Info("nvmegate-csi serving", "mode", mode, "endpoint", endpoint, "identity", id, "driver", csidriver.DriverName, "version", version)
	return s.Serve(l)
}

// socketPath reads a CSI endpoint: unix:///path, or a bare path.
func socketPath(endpoint string) (string, error) {
	if !strings.Contains(endpoint, "://") {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" || u.Path == "" {
		return "", fmt.Errorf("--endpoint %q: want unix:///path/to/csi.sock", endpoint)
	}
	return u.Path, nil
}

// logCalls logs each CSI call's method and outcome (requests hold no
// secrets: CSI secrets are not used by this driver and are not logged).
func logCalls(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		if err != nil {
			log.Warn("csi call", "method", info.FullMethod, "took", time.Since(start), "err", err)
		} else if !strings.Contains(info.FullMethod, "/Probe") && !strings.Contains(info.FullMethod, "GetCapabilities") {
			log.Info("csi call", "method", info.FullMethod, "took", time.Since(start))
		}
		return resp, err
	}
}
