package loadgen

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nvmegate/nvmegate/internal/grpcserver"
)

// NewFloorServer is the server of CallTrivial: grpc-go's health service
// and nothing else — no interceptors, no policy, no audit — on
// connections configured like the gateway's (grpcserver.ConnectionOptions)
// with creds, the gateway's kind of mTLS. Run it in a process of its own,
// as the gateway is, so that the floor pays what the gateway pays for a
// process: its own scheduler, heap and collector.
func NewFloorServer(creds credentials.TransportCredentials) *grpc.Server {
	s := grpc.NewServer(append(grpcserver.ConnectionOptions(time.Minute, 128), grpc.Creds(creds))...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	return s
}

// UseFloor points the fleet's CallTrivial at the floor server at addr
// (a node Spread over several, at its own): every node gets a connection
// of its own to it with its SVID (made lazily, at its first call, as the
// gateway's are).
func (f *Fleet) UseFloor(addr string) error {
	for _, n := range f.Nodes {
		a := addr
		if n.floorAddr != "" {
			a = n.floorAddr
		}
		c, err := grpc.NewClient(a, grpc.WithTransportCredentials(n.creds))
		if err != nil {
			return fmt.Errorf("loadgen: floor connection: %w", err)
		}
		if n.floor != nil {
			n.floor.Close()
		}
		n.floor = c
	}
	f.floorAddr = addr
	return nil
}

// Spread spreads the fleet over several gateway replicas and as many
// floor servers: node i connects to gateways[i%len(gateways)] and makes
// its trivial calls to floors[i%len(floors)] (either may be empty: the
// fleet's). The nodes' connections are made again, lazily, to their own.
func (f *Fleet) Spread(gateways, floors []string) error {
	for i, n := range f.Nodes {
		if len(gateways) > 0 {
			n.addr = gateways[i%len(gateways)]
			c, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(n.creds))
			if err != nil {
				return fmt.Errorf("loadgen: connection to %s: %w", n.addr, err)
			}
			n.conn.Close()
			n.conn = c
		}
		if len(floors) > 0 {
			n.floorAddr = floors[i%len(floors)]
		}
	}
	if len(floors) > 0 {
		return f.UseFloor(floors[0])
	}
	return nil
}

// closeFloor closes the nodes' floor connections (UseFloor makes new ones).
func (f *Fleet) closeFloor() {
	for _, n := range f.Nodes {
		if n.floor != nil {
			n.floor.Close()
			n.floor = nil
		}
	}
}
