// Package nvmegate holds the domain types that the gateway's packages share:
// tenants, targets, subsystems, namespaces, host bindings, jobs, grants and
// policy decisions, with their validation rules and the error type that every
// package returns.
//
// The root package depends on nothing but the standard library. Subpackages
// adapt one technology each (bbolt in store, OPA in authz, gRPC in gateway)
// and exchange these types with one another; see DESIGN §9 in the docs for
// the import rules.
package nvmegate
