package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

func (a *app) inventoryCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "inventory",
		Aliases: []string{"inv"},
		Short:   "Manage targets, subsystems, namespaces and host bindings (admins)",
	}
	cmd.AddCommand(a.targetCmd(), a.subsystemCmd(), a.namespaceCmd(), a.hostCmd())
	return cmd
}

// pageFlags are the paging flags of every list command.
type pageFlags struct {
	size  int32
	token string
}

func (p *pageFlags) register(cmd *cobra.Command) {
	cmd.Flags().Int32Var(&p.size, "page-size", 0, "results per page (0: the gateway's default)")
	cmd.Flags().StringVar(&p.token, "page-token", "", "token of the page to fetch, from a previous listing")
}

func (a *app) targetCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "target", Short: "Storage servers and their ports"}
	var t pb.Target
	var ports []string
	add := &cobra.Command{
		Use:   "add ID",
		Short: "Register a target",
		Example: `  nvmegate inventory target add stor-eu-1 --fabric fab-eu --region eu-west --driver nvmet \
    --port id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420,secure=none`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t.Id = args[0]
			t.Ports = nil
			for i, s := range ports {
				p, err := parsePort(s)
				if err != nil {
					return fmt.Errorf("--port #%d: %w", i+1, err)
				}
				t.Ports = append(t.Ports, p)
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).AddTarget(ctx, &pb.AddTargetRequest{Target: &t})
				if err != nil {
					return err
				}
				return a.print(resp, targetHeader, [][]string{targetRow(resp.Target)})
			})
		},
	}
	add.Flags().StringVar(&t.Fabric, "fabric", "", "fabric the ports are on")
	add.Flags().StringVar(&t.Region, "region", "", "region the server is in")
	add.Flags().StringVar(&t.Rack, "rack", "", "rack (optional)")
	add.Flags().StringVar(&t.Driver, "driver", "nvmet", "nvmet or spdk")
	add.Flags().StringArrayVar(&ports, "port", nil, "port as id=N,transport=tcp,family=ipv4,address=IP,service=4420[,secure=none|optional|required][,subnet=CIDR] (repeatable)")

	var region, fabric string
	var page pageFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List targets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).ListTargets(ctx, &pb.ListTargetsRequest{Region: region, Fabric: fabric, PageSize: page.size, PageToken: page.token})
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Targets))
				for _, t := range resp.Targets {
					rows = append(rows, targetRow(t))
				}
				return a.printPage(resp, targetHeader, rows, resp.NextPageToken)
			})
		},
	}
	list.Flags().StringVar(&region, "region", "", "only this region")
	list.Flags().StringVar(&fabric, "fabric", "", "only this fabric")
	page.register(list)

	get := &cobra.Command{
		Use: "get ID", Short: "Show a target", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).GetTarget(ctx, &pb.GetTargetRequest{Id: args[0]})
				if err != nil {
					return err
				}
				return a.print(resp, targetHeader, [][]string{targetRow(resp.Target)})
			})
		},
	}
	remove := &cobra.Command{
		Use: "remove ID", Short: "Remove a target without subsystems", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).RemoveTarget(ctx, &pb.RemoveTargetRequest{Id: args[0]})
				if err != nil {
					return err
				}
				return a.done(resp, "removed target "+args[0])
			})
		},
	}
	cmd.AddCommand(add, list, get, remove)
	return cmd
}

var targetHeader = []string{"ID", "FABRIC", "REGION", "RACK", "DRIVER", "PORTS"}

func targetRow(t *pb.Target) []string {
	var ports []string
	for _, p := range t.Ports {
		s := fmt.Sprintf("%d:%s://%s", p.Id, p.Transport, hostPort(p.Address, p.ServiceId))
		if p.SecureChannel != "" && p.SecureChannel != "none" {
			s += "(tls " + p.SecureChannel + ")"
		}
		ports = append(ports, s)
	}
	return []string{t.Id, t.Fabric, t.Region, dash(t.Rack), t.Driver, strings.Join(ports, ",")}
}

func hostPort(addr, svc string) string {
	if strings.Contains(addr, ":") {
		return "[" + addr + "]:" + svc
	}
	return addr + ":" + svc
}

// parsePort reads "id=1,transport=tcp,family=ipv4,address=10.0.0.1,service=4420,secure=none".
// The gateway validates the values; this only splits them.
func parsePort(s string) (*pb.Port, error) {
	p := &pb.Port{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		switch k {
		case "id":
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return nil, fmt.Errorf("id %q is not a port ID 1-65535", v)
			}
			p.Id = uint32(n)
		case "transport":
			p.Transport = v
		case "family":
			p.AddressFamily = v
		case "address":
			p.Address = v
		case "service":
			p.ServiceId = v
		case "secure":
			p.SecureChannel = v
		case "subnet":
			p.Subnet = v
		default:
			return nil, fmt.Errorf("unknown key %q (want id, transport, family, address, service, secure, subnet)", k)
		}
	}
	return p, nil
}

func (a *app) subsystemCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "subsystem", Aliases: []string{"subsys"}, Short: "NVM subsystems, one tenant each"}
	var s pb.Subsystem
	var ports []uint
	add := &cobra.Command{
		Use:     "add NQN",
		Short:   "Register a subsystem",
		Example: `  nvmegate inventory subsystem add nqn.2026-01.io.example:acme-train --target stor-eu-1 --tenant acme --ports 1 --dhchap`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s.Nqn = args[0]
			s.PortIds = nil
			for _, p := range ports {
				if p > math.MaxUint16 {
					return fmt.Errorf("--ports: %d is not a port ID 1-65535", p)
				}
				s.PortIds = append(s.PortIds, uint32(p))
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &s})
				if err != nil {
					return err
				}
				return a.print(resp, subsystemHeader, [][]string{subsystemRow(resp.Subsystem)})
			})
		},
	}
	add.Flags().StringVar(&s.TargetId, "target", "", "target ID")
	add.Flags().StringVar(&s.Tenant, "tenant", "", "owning tenant")
	add.Flags().UintSliceVar(&ports, "ports", nil, "target port IDs, comma-separated")
	add.Flags().BoolVar(&s.Dhchap, "dhchap", false, "the target supports DH-HMAC-CHAP")
	add.Flags().BoolVar(&s.Tls, "tls", false, "the target supports a TLS secure channel")
	add.Flags().StringVar(&s.Description, "description", "", "free text")

	var tenant, target string
	var page pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List subsystems", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).ListSubsystems(ctx, &pb.ListSubsystemsRequest{Tenant: tenant, TargetId: target, PageSize: page.size, PageToken: page.token})
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Subsystems))
				for _, s := range resp.Subsystems {
					rows = append(rows, subsystemRow(s))
				}
				return a.printPage(resp, subsystemHeader, rows, resp.NextPageToken)
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	list.Flags().StringVar(&target, "target", "", "only this target")
	page.register(list)

	get := &cobra.Command{
		Use: "get NQN", Short: "Show a subsystem", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).GetSubsystem(ctx, &pb.GetSubsystemRequest{Nqn: args[0]})
				if err != nil {
					return err
				}
				return a.print(resp, subsystemHeader, [][]string{subsystemRow(resp.Subsystem)})
			})
		},
	}
	remove := &cobra.Command{
		Use: "remove NQN", Short: "Remove a subsystem without namespaces", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).RemoveSubsystem(ctx, &pb.RemoveSubsystemRequest{Nqn: args[0]})
				if err != nil {
					return err
				}
				return a.done(resp, "removed subsystem "+args[0])
			})
		},
	}
	cmd.AddCommand(add, list, get, remove)
	return cmd
}

var subsystemHeader = []string{"NQN", "TARGET", "TENANT", "PORTS", "AUTH"}

func subsystemRow(s *pb.Subsystem) []string {
	var ports, auth []string
	for _, p := range s.PortIds {
		ports = append(ports, strconv.FormatUint(uint64(p), 10))
	}
	if s.Dhchap {
		auth = append(auth, "dhchap")
	}
	if s.Tls {
		auth = append(auth, "tls")
	}
	return []string{s.Nqn, s.TargetId, s.Tenant, strings.Join(ports, ","), strings.Join(auth, "+")}
}

func (a *app) namespaceCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "namespace", Aliases: []string{"ns"}, Short: "Namespaces holding tenants' datasets"}
	n := pb.Namespace{Dataset: &pb.Dataset{}, Qos: &pb.QoS{}}
	add := &cobra.Command{
		Use:   "add SUBSYSTEM_NQN NSID",
		Short: "Register a namespace",
		Example: `  nvmegate inventory namespace add nqn.2026-01.io.example:acme-train 1 --tenant acme --region eu-west \
    --class internal --dataset common-crawl/2026-10 --digest sha256:<64 hex>`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			nsid, err := parseNSID(args[1])
			if err != nil {
				return err
			}
			n.SubsystemNqn, n.Nsid = args[0], nsid
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: &n})
				if err != nil {
					return err
				}
				return a.print(resp, namespaceHeader, [][]string{namespaceRow(resp.Namespace)})
			})
		},
	}
	add.Flags().StringVar(&n.Tenant, "tenant", "", "owning tenant (the subsystem's)")
	add.Flags().StringVar(&n.Region, "region", "", "residency region of the data")
	add.Flags().StringVar(&n.DataClass, "class", "internal", "data class, e.g. public, internal, restricted, immutable")
	add.Flags().StringVar(&n.Dataset.Name, "dataset", "", "dataset name")
	add.Flags().StringVar(&n.Dataset.Digest, "digest", "", "dataset digest sha256:<hex>")
	add.Flags().Uint64Var(&n.Qos.MaxIops, "max-iops", 0, "QoS cap in IOPS (0: none)")
	add.Flags().StringVar(&n.BackingDevice, "backing-device", "", "block device on the target holding the namespace: the target agent exports it encrypted at rest (dm-crypt, the namespace's data key)")
	add.Flags().Uint64Var(&n.Qos.MaxMbps, "max-mbps", 0, "QoS cap in MB/s (0: none)")

	var tenant, subsys, region string
	var page pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List namespaces", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).ListNamespaces(ctx, &pb.ListNamespacesRequest{Tenant: tenant, SubsystemNqn: subsys, Region: region, PageSize: page.size, PageToken: page.token})
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Namespaces))
				for _, n := range resp.Namespaces {
					rows = append(rows, namespaceRow(n))
				}
				return a.printPage(resp, namespaceHeader, rows, resp.NextPageToken)
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	list.Flags().StringVar(&subsys, "subsystem", "", "only this subsystem NQN")
	list.Flags().StringVar(&region, "region", "", "only this region")
	page.register(list)

	get := &cobra.Command{
		Use: "get SUBSYSTEM_NQN NSID", Short: "Show a namespace", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			nsid, err := parseNSID(args[1])
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).GetNamespace(ctx, &pb.GetNamespaceRequest{SubsystemNqn: args[0], Nsid: nsid})
				if err != nil {
					return err
				}
				return a.print(resp, namespaceHeader, [][]string{namespaceRow(resp.Namespace)})
			})
		},
	}
	var erase bool
	remove := &cobra.Command{
		Use: "remove SUBSYSTEM_NQN NSID [--erase]", Short: "Remove a namespace; --erase also destroys its data key (crypto-erase)", Args: cobra.ExactArgs(2),
		Long: `Remove a namespace. With --erase, once the target has closed the namespace's
dm-crypt mapping, its data key and KEK are destroyed (recorded in the audit
log): what is left on the backing device can never be read again. If the
target does not confirm, the key is kept and the command fails; repeat it.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			nsid, err := parseNSID(args[1])
			if err != nil {
				return err
			}
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).RemoveNamespace(ctx, &pb.RemoveNamespaceRequest{SubsystemNqn: args[0], Nsid: nsid, Erase: erase})
				if err != nil {
					return err
				}
				if strings.HasPrefix(resp.DataKey, "destroyed") {
					return a.done(resp, fmt.Sprintf("removed namespace %s/%d; its data key is destroyed (crypto-erase)", args[0], nsid))
				}
				return a.done(resp, fmt.Sprintf("removed namespace %s/%d; data key %s", args[0], nsid, resp.DataKey))
			})
		},
	}
	remove.Flags().BoolVar(&erase, "erase", false, "destroy the namespace's data key once its target has closed the mapping (crypto-erase)")
	cmd.AddCommand(add, list, get, remove)
	return cmd
}

var namespaceHeader = []string{"SUBSYSTEM", "NSID", "TENANT", "REGION", "CLASS", "DATASET", "AT REST"}

func namespaceRow(n *pb.Namespace) []string {
	// AT REST: encrypted by the target agent (dm-crypt over the backing
	// device), or the operator's to answer for.
	atRest := "operator's"
	if n.BackingDevice != "" {
		atRest = "dm-crypt on " + n.BackingDevice
	}
	return []string{n.SubsystemNqn, strconv.FormatUint(uint64(n.Nsid), 10), n.Tenant, n.Region, n.DataClass, n.GetDataset().GetName(), atRest}
}

func parseNSID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("NSID %q is not a number 1-4294967294", s)
	}
	return uint32(n), nil
}

func (a *app) hostCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "host", Short: "Bindings of node identities to host NQNs"}
	var h pb.HostBinding
	add := &cobra.Command{
		Use:   "add SPIFFE_ID",
		Short: "Bind a node identity to a host NQN",
		Long: `Bind a node identity to a host NQN.

The NQN is written as the node uses it, a UUID NQN in lower case (upper case
names the same host and is refused). It must be bound to no other identity,
and no active grant of another identity may use it: a node that connected
without a binding uses its derived NQN, and its grants must be revoked
(nvmegate revoke --node) before another node can be bound to that NQN.`,
		Example: `  nvmegate inventory host add spiffe://example.org/node/gpu-17 --nqn nqn.2014-08.org.nvmexpress:uuid:<uuid> --tenant acme`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h.SpiffeId = args[0]
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).AddHostBinding(ctx, &pb.AddHostBindingRequest{Binding: &h})
				if err != nil {
					return err
				}
				return a.print(resp, hostHeader, [][]string{hostRow(resp.Binding)})
			})
		},
	}
	add.Flags().StringVar(&h.HostNqn, "nqn", "", "the node's host NQN")
	add.Flags().StringVar(&h.Tenant, "tenant", "", "restrict the node to this tenant (optional)")
	add.Flags().StringArrayVar(&h.Subnets, "subnet", nil, "a subnet of the node's fabric segment, as CIDR (repeatable; none: not segmented)")

	var tenant string
	var page pageFlags
	list := &cobra.Command{
		Use: "list", Short: "List host bindings", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).ListHostBindings(ctx, &pb.ListHostBindingsRequest{Tenant: tenant, PageSize: page.size, PageToken: page.token})
				if err != nil {
					return err
				}
				rows := make([][]string, 0, len(resp.Bindings))
				for _, h := range resp.Bindings {
					rows = append(rows, hostRow(h))
				}
				return a.printPage(resp, hostHeader, rows, resp.NextPageToken)
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	page.register(list)

	get := &cobra.Command{
		Use: "get SPIFFE_ID", Short: "Show a host binding", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).GetHostBinding(ctx, &pb.GetHostBindingRequest{SpiffeId: args[0]})
				if err != nil {
					return err
				}
				return a.print(resp, hostHeader, [][]string{hostRow(resp.Binding)})
			})
		},
	}
	remove := &cobra.Command{
		Use: "remove SPIFFE_ID", Short: "Remove a host binding; the node's grants are revoked", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := pb.NewInventoryClient(c).RemoveHostBinding(ctx, &pb.RemoveHostBindingRequest{SpiffeId: args[0]})
				if err != nil {
					return err
				}
				return a.done(resp, "removed host binding "+args[0])
			})
		},
	}
	cmd.AddCommand(add, list, get, remove)
	return cmd
}

var hostHeader = []string{"SPIFFE ID", "HOST NQN", "TENANT", "SEGMENT"}

func hostRow(h *pb.HostBinding) []string {
	return []string{h.SpiffeId, h.HostNqn, dash(h.Tenant), dash(strings.Join(h.Subnets, ","))}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
