// Package nvmegatev1 is the generated Go code of the nvmegate gRPC API
// (proto/nvmegate/v1/*.proto). Regenerate it with `make proto`; do not edit
// the *.pb.go files. Only the gateway and the CLI import this package: the
// rest of the code base speaks the domain types of the root package.
package nvmegatev1
