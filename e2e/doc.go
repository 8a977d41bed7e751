// Package e2e holds the end-to-end tier: tests that build the real binaries
// and run them as processes, the way users and CI do. `make test` runs it
// with the other tiers; `go test -short` skips it.
package e2e
