// Command nvmegate-target is the target agent of one storage server: with
// the target's own SVID (spiffe://<td>/target/<target id>) it streams the
// target's desired state from the gateway — the hosts allowed on its
// subsystems with their keys, and nothing of any other target — applies
// each generation with the local driver (Linux nvmet configfs, or an SPDK
// nvmf_tgt over JSON-RPC) and acknowledges it; the gateway answers a
// Connect only after that. The stream starts with the whole state and then
// carries deltas (the host entries that changed), applied in order; a
// delta on top of a generation the agent has not applied makes it
// reconnect for the whole state (targetagent.Remote). It reconnects with backoff when the gateway
// restarts, and stops on SIGTERM.
//
// Behind several gateway replicas, list them all (--addr r0:7443,r1:7443,r2:7443):
// the agent streams from one at a time, on a connection to each, and moves
// to the next when its replica refuses the stream (it cannot read the
// latest state), sends a state older than one applied, or falls silent
// (no heartbeat for 6 s). Behind one address that balances over the
// replicas it cannot choose: it leaves a replica only when the connection
// fails.
//
//	nvmegate-target --spiffe-socket unix:///run/spire/agent.sock --addr gw:7443 \
//	    --nvmet-root /sys/kernel/config/nvmet
//	nvmegate-target --dev-dir .demo --dev-identity target-stor-eu-1 --nvmet-root .demo/nvmet
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/cryptdev"
	"github.com/nvmegate/nvmegate/fabric"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/fabric/spdk"
	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/keyring"
	"github.com/nvmegate/nvmegate/targetagent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

// run parses the flags and runs the agent until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("nvmegate-target", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o clientconn.Options
	o.AddFlags(fs, "target-stor-eu-1")
	nvmetRoot := fs.String("nvmet-root", "", "the nvmet configfs root (e.g. /sys/kernel/config/nvmet)")
	spdkSocket := fs.String("spdk-socket", "", "the SPDK JSON-RPC socket (e.g. /var/tmp/spdk.sock)")
	spdkKeyDir := fs.String("spdk-key-dir", "", "absolute directory for SPDK key files")
	cryptsetup := fs.String("cryptsetup", "cryptsetup", "cryptsetup binary, for namespaces exported encrypted at rest ('' for none: they are refused)")
	reencryptDir := fs.String("reencrypt-dir", "/var/lib/nvmegate-target/reencrypt", "directory for the records and journals of data-key rotations (re-encryption); losing it during one loses the namespace's data ('' refuses rotations)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var (
		d      targetagent.Driver
		runner *cryptdev.Runner
	)
	switch {
	case *nvmetRoot != "" && *spdkSocket == "":
		nd := &nvmet.Driver{Root: *nvmetRoot}
		// The kernel's .nvme keyring, where nvmet's TLS handshakes find
		// the hosts' PSKs: there on Linux 6.7 and later once nvmet-tcp
		// (or nvme-tcp) is loaded with TLS. Without it the agent still
		// serves DH-HMAC-CHAP hosts and refuses hosts with a PSK.
		if r, err := keyring.NVMe(); err == nil {
			nd.PSKs = r
		} else {
			fmt.Fprintf(stderr, "nvmegate-target: no TLS PSKs (%v): hosts granted with TLS will be refused\n", err)
		}
		// Namespaces with a backing device go out through dm-crypt,
		// opened by cryptsetup; without it they are not exported, never
		// in the clear, and reported to the gateway with each state, whose
		// other namespaces and hosts are applied.
		if bin, err := exec.LookPath(*cryptsetup); *cryptsetup != "" && err == nil {
			nd.Crypt = &cryptdev.Cryptsetup{Binary: bin}
		} else {
			fmt.Fprintf(stderr, "nvmegate-target: no cryptsetup (%v): namespaces to encrypt at rest will not be exported\n", err)
		}
		d = nd
		if nd.Crypt != nil && *reencryptDir != "" {
			runner = &cryptdev.Runner{Rekey: &cryptdev.Rekey{Dir: *reencryptDir}}
			nd.Reencrypt = runner
		}
	case *spdkSocket != "" && *spdkKeyDir != "" && *nvmetRoot == "":
		d = &spdk.Driver{Socket: *spdkSocket, KeyDir: *spdkKeyDir}
	default:
		return errors.New("give --nvmet-root, or --spdk-socket with --spdk-key-dir")
	}
	// One connection per replica: the agent moves on from a replica that
	// hangs, lags behind the others or cannot read the latest state.
	conns, src, err := clientconn.DialEach(ctx, o)
	if err != nil {
		return err
	}
	defer src.Close()
	replicas := make([]grpc.ClientConnInterface, len(conns))
	for i, c := range conns {
		defer c.Close()
		replicas[i] = c
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	log.Info("target agent running", "replicas", len(replicas))
	r := &targetagent.Remote{Replicas: replicas, Driver: d, Log: log, Applied: func(gen uint64, err error) {
		if ns, partial := fabric.NotServedIn(err); err == nil || partial {
			log.Info("applied", "generation", gen, "namespaces_not_served", len(ns))
		}
	}}
	if runner != nil {
		runner.Done = func(j cryptdev.Job, err error) {
			if err != nil {
				log.Error("re-encryption stopped; it resumes at the next state", "subsystem", j.Subsystem, "nsid", j.NSID, "generation", j.Generation, "err", err)
			} else {
				log.Info("re-encrypted", "subsystem", j.Subsystem, "nsid", j.NSID, "generation", j.Generation)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if rerr := r.Reencrypted(rctx, j.Subsystem, j.NSID, j.Generation, err); rerr != nil {
				log.Warn("re-encryption report not taken; repeated at the next state", "subsystem", j.Subsystem, "nsid", j.NSID, "err", rerr)
			}
		}
	}
	return r.Run(ctx)
}
