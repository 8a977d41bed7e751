package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/loadgen"
)

// floorServerID is the floor server's SPIFFE ID: a gateway path, so that
// the nodes' clients accept it as they accept the gateway.
const floorServerID = identity.GatewayPathPrefix + "bench-floor"

// benchFloorServerCmd serves the trivial floor (loadgen.NewFloorServer)
// with an SVID from the dev CA, on 127.0.0.1, until its standard input
// closes: bench connect --call trivial starts it as a process of its own
// and reads the address from the first line it prints.
func (a *app) benchFloorServerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "floor-server --dev-dir DIR",
		Short:  "Serve the trivial floor of bench connect (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.id.DevDir == "" {
				return errors.New("floor-server needs --dev-dir")
			}
			ca, err := devca.Load(filepath.Join(a.id.DevDir, "ca"))
			if err != nil {
				return err
			}
			id, err := spiffeid.FromPath(ca.TrustDomain(), floorServerID)
			if err != nil {
				return err
			}
			now := time.Now()
			svid, err := ca.Issue(id, now.Add(-time.Minute), now.Add(24*time.Hour))
			if err != nil {
				return err
			}
			src := identity.StaticSource(svid, ca.Bundle())
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			srv := loadgen.NewFloorServer(identity.ServerCredentials(src, ca.TrustDomain()))
			go func() {
				_, _ = io.Copy(io.Discard, os.Stdin)
				srv.Stop()
			}()
			fmt.Fprintf(a.stdout, "listening %s\n", lis.Addr())
			return srv.Serve(lis)
		},
	}
}

// startFloorServer starts this binary's floor-server as a child process
// and returns its address and how to stop it.
func (a *app) startFloorServer(ctx context.Context) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	c := exec.CommandContext(ctx, self, "--dev-dir", a.id.DevDir, "bench", "floor-server")
	c.Stderr = os.Stderr
	stdin, err := c.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	out, err := c.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := c.Start(); err != nil {
		return "", nil, fmt.Errorf("start the floor server: %w", err)
	}
	stop := func() { stdin.Close(); _ = c.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		stop()
		return "", nil, fmt.Errorf("the floor server did not start (it said %q): %v", line, err)
	}
	return addr, stop, nil
}
