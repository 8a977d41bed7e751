// Command nvmegate is the nvmegate CLI for admins, schedulers, nodes and
// auditors. It talks to the gateway over gRPC with mTLS, as the SPIFFE
// identity it is given:
//
//	nvmegate --spiffe-socket unix:///run/spire/agent.sock inventory target list
//	nvmegate --cert me.pem --key me.key --bundle bundle.pem --addr gw:7443 ...
//	nvmegate --dev-dir .demo --dev-identity admin inventory target list
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	a := newApp(os.Stdout, os.Stderr)
	root := a.root()
	if args := hookArgs(os.Args[0]); args != nil {
		root.SetArgs(args) // run as a Slurm hook (slurm.go)
	}
	err := root.ExecuteContext(ctx)
	a.close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}
