// Package identity gives nvmegate processes their SPIFFE identity and turns
// it into gRPC mutual TLS.
//
// A Source provides this process's X.509-SVID and the trust bundles that
// verify peers, and keeps both current without a restart:
//
//   - NewWorkloadSource: the SPIFFE Workload API (SPIRE agent); production.
//   - NewFileSource: PEM files on disk, re-checked (stat) on every handshake
//     and reloaded when replaced; for `nvmegated dev`, for sites that deliver
//     SVIDs as files (spiffe-helper, cert-manager csi-driver-spiffe), and for
//     rotation tests.
//   - StaticSource: fixed values, for tests (with identity/devca).
//
// ServerCredentials and ClientCredentials build gRPC transport credentials on
// go-spiffe's tlsconfig: TLS 1.3 only, a verified X.509-SVID required on both
// sides. The server admits only members of its own trust domain; a peer from
// another trust domain, with an expired or unverifiable SVID, with an SVID
// whose ID is only the trust domain (spiffe://<td>, which the X509-SVID
// spec forbids on leaves) or with no certificate fails the TLS handshake,
// before any gRPC handler or interceptor runs. Handlers read the verified caller with PeerID:
//
//	srv := grpc.NewServer(grpc.Creds(identity.ServerCredentials(src, td)))
//	...
//	func (s *service) Connect(ctx context.Context, ...) {
//		id, ok := identity.PeerID(ctx) // spiffe://<td>/node/<host>
//
// This package authenticates; it does not interpret the ID's path. Roles and
// tenants in the path are for policy (authz) to judge (DESIGN.md §3).
package identity
