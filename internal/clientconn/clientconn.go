// Package clientconn dials the gateway as a SPIFFE identity, for the CLI
// and the target agent: the SVID comes from the Workload API, from PEM
// files, or from a dev trust domain directory (which also names the dev
// gateway's address), and the gateway must present a gateway SVID of the
// client's trust domain (or exactly ServerID). The address may list the
// replicas of a gateway on etcd: the connection uses the first that
// answers and moves to another when it fails.
package clientconn

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
)

// Options say how to reach the gateway and as whom.
type Options struct {
	Addr         string // host:port, or replicas' host:port,host:port,…; default 127.0.0.1:7443, or the dev gateway's
	SPIFFESocket string // Workload API address
	SPIFFEID     string // picks this SVID when the Workload API offers several
	Cert, Key    string // SVID files (PEM)
	Bundle       string // trust bundle (PEM)
	DevDir       string // dev trust domain directory (nvmegated dev)
	DevIdentity  string // dev identity name in DevDir
	ServerID     string // required SPIFFE ID of the gateway; "" any gateway of the trust domain
}

// Dial connects. The caller closes both the connection and the source.
func Dial(ctx context.Context, o Options) (*grpc.ClientConn, identity.Source, error) {
	conns, src, err := dial(ctx, o, false)
	if err != nil {
		return nil, nil, err
	}
	return conns[0], src, nil
}

// DialEach connects to each replica of an address list on a connection
// of its own (one address: one connection), for an agent that chooses the
// replica itself: a target agent leaves a replica that hangs or lags for
// the next (targetagent.Remote.Replicas), which one connection over all of
// them, staying on a replica that still answers pings, would not. The
// caller closes the connections and the source.
func DialEach(ctx context.Context, o Options) ([]*grpc.ClientConn, identity.Source, error) {
	return dial(ctx, o, true)
}

// Keepalive is the clients' keepalive: a ping after 10 s without
// activity (the least gRPC allows, and what the gateway permits), and the
// connection closed 5 s after one goes unanswered — a gateway that hangs
// (a process stopped, a host gone) is left within 15 s, even with no call
// in flight.
var Keepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}

func dial(ctx context.Context, o Options, each bool) ([]*grpc.ClientConn, identity.Source, error) {
	cert, key, bundle, addr := o.Cert, o.Key, o.Bundle, o.Addr
	if o.DevDir != "" || o.DevIdentity != "" {
		if o.DevDir == "" || o.DevIdentity == "" {
			return nil, nil, errors.New("--dev-dir and --dev-identity go together")
		}
		if cert != "" || key != "" || bundle != "" || o.SPIFFESocket != "" {
			return nil, nil, errors.New("--dev-identity excludes --cert/--key/--bundle/--spiffe-socket")
		}
		cert, key = devca.SVIDPaths(o.DevDir, o.DevIdentity)
		bundle = devca.BundlePath(o.DevDir)
		if addr == "" {
			var err error
			if addr, err = readyAddr(devca.ReadyPath(o.DevDir)); err != nil {
				return nil, nil, err
			}
		}
	}
	if addr == "" {
		addr = "127.0.0.1:7443"
	}
	var (
		src identity.Source
		err error
	)
	switch {
	case o.SPIFFESocket != "":
		src, err = identity.NewWorkloadSource(ctx, o.SPIFFESocket, o.SPIFFEID)
	case cert != "" && key != "" && bundle != "":
		if _, statErr := os.Stat(cert); statErr != nil && o.DevIdentity != "" {
			return nil, nil, fmt.Errorf("no dev identity %q in %s", o.DevIdentity, o.DevDir)
		}
		src, err = identity.NewFileSource(cert, key, bundle)
	default:
		return nil, nil, errors.New("an identity is required: --spiffe-socket, --cert/--key/--bundle, or --dev-dir with --dev-identity")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("identity: %w", err)
	}
	authorizer, err := serverAuthorizer(o.ServerID, src)
	if err != nil {
		src.Close()
		return nil, nil, err
	}
	addrs := []string{addr}
	if each {
		if addrs, err = split(addr); err != nil {
			src.Close()
			return nil, nil, err
		}
	}
	var conns []*grpc.ClientConn
	for _, a := range addrs {
		target, opts, err := resolve(a)
		if err != nil {
			closeAll(conns)
			src.Close()
			return nil, nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(identity.ClientCredentials(src, authorizer)), grpc.WithKeepaliveParams(Keepalive))
		conn, err := grpc.NewClient(target, opts...)
		if err != nil {
			closeAll(conns)
			src.Close()
			return nil, nil, fmt.Errorf("dial %s: %w", a, err)
		}
		conns = append(conns, conn)
	}
	return conns, src, nil
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		c.Close()
	}
}

// split checks and splits an address list.
func split(addr string) ([]string, error) {
	out := strings.Split(addr, ",")
	for _, a := range out {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("--addr %q: each replica's address must be host:port: %w", addr, err)
		}
	}
	return out, nil
}

// replicasScheme names the resolver of an address list.
const replicasScheme = "nvmegate-replicas"

// resolve turns addr into gRPC's target: one address as it is; a list of
// replicas' addresses as a fixed resolver state, which gRPC's default
// policy (pick_first) tries in order and leaves for the next when the
// connection fails. The gateway is identified by its SVID, not a host
// name, so every replica is verified alike.
func resolve(addr string) (string, []grpc.DialOption, error) {
	if !strings.Contains(addr, ",") {
		return addr, nil, nil
	}
	list, err := split(addr)
	if err != nil {
		return "", nil, err
	}
	var addrs []resolver.Address
	for _, a := range list {
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	r := manual.NewBuilderWithScheme(replicasScheme)
	r.InitialState(resolver.State{Addresses: addrs})
	return replicasScheme + ":///gateway", []grpc.DialOption{grpc.WithResolvers(r)}, nil
}

// serverAuthorizer decides which gateway SVIDs the client accepts: the exact
// serverID, or any gateway (spiffe://<td>/gateway/...) of the client's own
// trust domain; never another workload of the domain.
func serverAuthorizer(serverID string, src identity.Source) (tlsconfig.Authorizer, error) {
	if serverID != "" {
		id, err := spiffeid.FromString(serverID)
		if err != nil {
			return nil, fmt.Errorf("--server-id: %w", err)
		}
		return tlsconfig.AuthorizeID(id), nil
	}
	svid, err := src.GetX509SVID()
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

// DevAddr is the gRPC address of the dev gateway running on dir.
func DevAddr(dir string) (string, error) { return readyAddr(devca.ReadyPath(dir)) }

// AddFlags registers the identity flags on fs, with the same names for
// the CLI and both agents (cobra commands add fs with AddGoFlagSet). devIdentity is an
// example dev identity name for the help text.
func (o *Options) AddFlags(fs *flag.FlagSet, devIdentity string) {
	fs.StringVar(&o.Addr, "addr", "", "gateway address host:port, or the replicas' host:port,host:port,… (default 127.0.0.1:7443, or the dev gateway's)")
	fs.StringVar(&o.SPIFFESocket, "spiffe-socket", "", "SPIFFE Workload API address for this program's SVID")
	fs.StringVar(&o.SPIFFEID, "spiffe-id", "", "this program's SPIFFE ID, when the Workload API offers several SVIDs")
	fs.StringVar(&o.Cert, "cert", "", "SVID certificate chain (PEM)")
	fs.StringVar(&o.Key, "key", "", "SVID private key (PEM)")
	fs.StringVar(&o.Bundle, "bundle", "", "trust bundle (PEM)")
	fs.StringVar(&o.DevDir, "dev-dir", "", "dev trust domain directory (from nvmegated dev)")
	fs.StringVar(&o.DevIdentity, "dev-identity", "", "dev identity name, e.g. "+devIdentity)
	fs.StringVar(&o.ServerID, "server-id", "", "required SPIFFE ID of the gateway (default: any spiffe://<td>/gateway/... of this program's trust domain)")
}
