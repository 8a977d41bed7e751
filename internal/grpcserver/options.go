package grpcserver

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// ConnectionOptions are the gateway's connection-level server options
// (message size, buffers, windows, keepalive, handler pool) without
// credentials or interceptors. handshakeTimeout bounds a connection's TLS
// handshake; workers is the reused handler pool.
func ConnectionOptions(handshakeTimeout time.Duration, workers int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(4 << 20),
		// Bound the TLS handshake so idle peers cannot hold connections
		// open.
		grpc.ConnectionTimeout(handshakeTimeout),
		// Tens of thousands of mostly idle node connections: a write
		// buffer only while a connection writes, and no read buffer of
		// gRPC's own — the TLS connection under the framer already holds
		// each decrypted record, so a second buffer only copied it, and
		// cost 8 KiB per connection (80 MiB of live heap in a 10,000-node
		// storm). gRPC's defaults are 32 KiB each per connection.
		grpc.SharedWriteBuffer(true),
		grpc.ReadBufferSize(0),
		// Fixed flow-control windows: with gRPC's default, BDP
		// estimation, every new connection pings to size windows that
		// calls of a few hundred bytes never fill — a round trip and
		// frames on both sides per node of a storm.
		grpc.InitialWindowSize(1 << 16),
		grpc.InitialConnWindowSize(1 << 16),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Pings after a minute of silence: a peer that is gone (a target
		// agent's server lost power) is noticed within 80 s, and its
		// stream ends — a target takes one live agent stream, so a dead
		// one must not keep the restarted agent out.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		// Reused handler goroutines: a policy evaluation recurses deeply,
		// and a fresh goroutine per call spent ~17% of the CPU growing its
		// stack under load (pprof, bench connect). Calls beyond the pool
		// still get goroutines of their own.
		grpc.NumStreamWorkers(uint32(workers)),
	}
}
