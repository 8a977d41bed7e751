// Command nvmegated is the nvmegate gateway daemon.
//
//	nvmegated --config /etc/nvmegate/nvmegated.yaml
//	nvmegated dev --dir .demo      # dev trust domain + embedded defaults
//	nvmegated replay --state-dir /var/lib/nvmegate   # the store against a fresh replay of the log (gateway stopped)
//
// See the README for the configuration and deploy/ for examples.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if len(os.Args) > 1 && os.Args[1] == "replay" {
		if err := runReplay(ctx, os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "nvmegated replay:", err)
			os.Exit(1)
		}
		return
	}
	m := NewMain()
	if err := m.ParseFlags(ctx, os.Args[1:]); errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "nvmegated:", err)
		os.Exit(2)
	}
	err := m.Open(ctx)
	if err == nil {
		err = m.Run(ctx)
	}
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nvmegated:", err)
		os.Exit(1)
	}
}
