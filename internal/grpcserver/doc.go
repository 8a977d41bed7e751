// Package grpcserver holds the connection-level options of nvmegate's gRPC
// servers: the gateway's, and the bench's floor server, whose trivial
// calls must ride connections configured like the gateway's for a ratio
// between the two to mean anything.
package grpcserver
