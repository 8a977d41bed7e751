// Package devca is a small in-process certificate authority that issues real
// X.509-SVIDs for one SPIFFE trust domain.
//
// It exists for development and tests only: `nvmegated dev` uses it to write a
// throw-away trust domain into a directory, and tests across the project use it
// whenever they need real mTLS (real certificates, real handshakes) instead of
// mocks. The production path is SPIRE, reached through the SPIFFE Workload API
// (see identity.NewWorkloadSource); nothing in a production deployment should
// import this package.
//
// A CA is a self-signed ECDSA P-256 root whose URI SAN is the trust domain ID
// (spiffe://<td>). Issue returns leaf X.509-SVIDs that follow the SPIFFE
// X509-SVID specification: exactly one URI SAN, not a CA, digitalSignature key
// usage, serverAuth and clientAuth extended key usages, a fresh P-256 key and a
// random 128-bit serial. Validity is chosen by the caller, so tests can make
// SVIDs that are already expired or not yet valid.
//
// Files:
//
//	ca.pem        root certificate (0644)        written by Save, read by Load
//	ca.key        root key, PKCS#8 PEM (0600)    written by Save, read by Load
//	<name>.pem    SVID chain, leaf first (0644)  written by WriteSVID
//	<name>.key    SVID key, PKCS#8 PEM (0600)    written by WriteSVID
//	<bundle>      trust bundle, PEM certs (0644) written by WriteBundle
//
// Every file is replaced atomically (temporary file in the same directory,
// fsync, rename, fsync of the directory), so a reader such as
// identity.FileSource sees either the old or the new content of each file,
// never a torn one. See WriteSVID for what a reader sees between the two files
// of one SVID.
//
// Typical test use:
//
//	ca, _ := devca.New(spiffeid.RequireTrustDomainFromString("nvmegate.test"), time.Now())
//	svid, _ := ca.Issue(spiffeid.RequireFromString("spiffe://nvmegate.test/node/h1"),
//		time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
//	src := identity.StaticSource(svid, ca.Bundle())
package devca
