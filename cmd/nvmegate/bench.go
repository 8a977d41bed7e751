package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/loadgen"
)

func (a *app) benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Load generators against a running gateway"}
	var (
		o                     loadgen.Options
		storm                 bool
		admin, sched, auditor string
		stormTimeout          time.Duration
		acksFile              string
		secretsFile           string
		calls                 []string
	)
	connect := &cobra.Command{
		Use:   "connect --dev-dir DIR [--nodes N] [--namespaces M] [--concurrency C] [--duration D] [--storm] [--call trivial,health,connect]",
		Short: "Connect storm / sustained connects from N node identities, each with its own mTLS connection",
		Long: `Registers a target, a subsystem with M namespaces, N node host bindings and
jobs scoping them (as the admin and the tenant's scheduler), mints N node
SVIDs with the dev trust domain's CA, and then either keeps C connects in
flight for D (each node connecting in turn), or with --storm connects all N
nodes at once and reports the time until the last is granted (each node
retrying a failed attempt, as a node agent would; --timeout bounds one
attempt). It reports
grants/s, latency percentiles and errors by code, then checks that every
acknowledged grant is in the audit log at the index it was answered with
(exit status 1 if any is not).

Needs a dev gateway (nvmegated dev): the node SVIDs come from its CA.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// This process stands in for a whole fleet — N nodes'
			// connections in one heap — on cores the gateway shares: a
			// lazier collector (GOGC in the environment wins) keeps the
			// fleet's garbage collection from taking the gateway's CPU
			// (-17% client CPU in a 10,000-node health storm).
			if os.Getenv("GOGC") == "" {
				debug.SetGCPercent(400)
			}
			if o.RunID == "" {
				b := make([]byte, 4)
				rand.Read(b)
				o.RunID = hex.EncodeToString(b)
			}
			ctx := cmd.Context()
			env, closeEnv, err := a.benchEnv(cmd, admin, sched, auditor)
			if err != nil {
				return err
			}
			defer closeEnv()
			if secretsFile != "" {
				f, err := os.OpenFile(secretsFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
				if err != nil {
					return err
				}
				defer f.Close()
				o.Secrets = f
			}
			if acksFile != "" {
				f, err := os.OpenFile(acksFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
				if err != nil {
					return err
				}
				defer f.Close()
				o.Acks = f
			}
			fmt.Fprintf(a.stdout, "setup      run %s: %d nodes in %d-node jobs, %d namespaces ...", o.RunID, o.Nodes, o.JobSize, o.Namespaces)
			t0 := time.Now()
			fleet, err := loadgen.Setup(ctx, env, o)
			if err != nil {
				return statusErr(err)
			}
			defer fleet.Close()
			fmt.Fprintf(a.stdout, " %s\n", time.Since(t0).Round(time.Millisecond))
			if slices.Contains(calls, string(loadgen.CallTrivial)) {
				addr, stop, err := a.startFloorServer(ctx)
				if err != nil {
					return err
				}
				defer stop()
				if err := fleet.UseFloor(addr); err != nil {
					return err
				}
			}
			var (
				r      *loadgen.Result
				acks   []loadgen.Ack
				floors []*loadgen.Result
			)
			for _, c := range calls {
				o.Call = loadgen.Call(c)
				if storm {
					fmt.Fprintf(a.stdout, "storm      all %d nodes at once: %s\n", o.Nodes, c)
					r = loadgen.Storm(ctx, fleet, o, stormTimeout, a.timeout)
				} else {
					limit := ""
					if o.Requests > 0 {
						limit = fmt.Sprintf(" or %d calls", o.Requests)
					}
					if o.Rate > 0 {
						fmt.Fprintf(a.stdout, "load       open loop at %g calls/s for %s%s: %s\n", o.Rate, o.Duration, limit, c)
					} else {
						fmt.Fprintf(a.stdout, "load       %d in flight for %s%s: %s\n", o.Concurrency, o.Duration, limit, c)
					}
					r = loadgen.Run(ctx, fleet, o)
				}
				fmt.Fprint(a.stdout, loadgen.Summary(r))
				if r.Call == loadgen.CallConnect {
					for _, f := range floors {
						fmt.Fprint(a.stdout, loadgen.Ratio(r, f, storm))
					}
				} else {
					floors = append(floors, r)
				}
				acks = append(acks, r.Acks...)
			}
			missing, err := loadgen.Verify(ctx, env, acks)
			if err != nil {
				return statusErr(err)
			}
			if len(missing) > 0 {
				return fmt.Errorf("%d acknowledged grant(s) missing from the audit log, e.g. %s", len(missing), missing[0])
			}
			fmt.Fprintf(a.stdout, "audit      all %d acknowledged grants are in the log at their answered index\n", len(acks))
			return nil
		},
	}
	f := connect.Flags()
	f.IntVar(&o.Nodes, "nodes", 100, "node identities (N)")
	f.IntVar(&o.Namespaces, "namespaces", 8, "namespaces in every job's scope (M)")
	f.IntVar(&o.Concurrency, "concurrency", 32, "connects in flight (C)")
	f.Float64Var(&o.Rate, "rate", 0, "open loop: start this many calls per second on a fixed schedule, whatever the answers do (latency from each call's scheduled start); --concurrency is then ignored")
	f.DurationVar(&o.Duration, "duration", 10*time.Second, "how long to keep connecting (D)")
	f.IntVar(&o.Requests, "requests", 0, "stop after this many calls, if sooner than --duration (0: no limit)")
	f.IntVar(&o.JobSize, "job-size", 256, "nodes per job")
	f.BoolVar(&storm, "storm", false, "connect all N nodes at once; report the time until all are granted")
	f.StringSliceVar(&calls, "call", []string{"connect"}, `what each node does, in order on the same fleet: connect, or a floor — trivial (a health check on a bare gRPC server in a process of its own, over an mTLS connection of the node's), health (a health check on the gateway, through its interceptors and a policy decision) or handshake (a new mTLS connection to the gateway and nothing else); a connect after floors is reported as a ratio to each; in a storm every node makes a new connection for each`)
	f.DurationVar(&stormTimeout, "storm-timeout", 5*time.Minute, "give up on a storm after this long")
	f.StringVar(&o.Tenant, "tenant", "acme", "the tenant of the scheduler identity")
	f.StringVar(&o.Region, "region", "eu-west", "region of the target and namespaces")
	f.StringVar(&o.RunID, "run-id", "", "names this run's target, subsystem, jobs and nodes (default random)")
	f.StringVar(&admin, "admin-identity", "admin", "dev identity registering the inventory")
	f.StringVar(&sched, "scheduler-identity", "acme-scheduler", "dev identity admitting the jobs")
	f.StringVar(&auditor, "auditor-identity", "auditor", "dev identity reading the audit log")
	f.StringVar(&acksFile, "acks", "", "append every acknowledged grant to FILE as it arrives (for bench verify)")
	f.StringVar(&secretsFile, "secrets-out", "", "append a sample of the secrets received to FILE (0600), for leak tests")

	verify := &cobra.Command{
		Use:   "verify --dev-dir DIR --acks FILE",
		Short: "Check that every grant in an acks file is in the audit log at its answered index",
		Long: `Reads the grants a bench acknowledged (bench connect --acks FILE, possibly
across gateway crashes) and checks each against the audit log: an
acknowledged grant must have its grant entry at the index it was answered
with. Exit status 1 if any does not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := os.Open(acksFile)
			if err != nil {
				return err
			}
			defer f.Close()
			acks, err := loadgen.ReadAcks(f)
			if err != nil {
				return err
			}
			env, closeEnv, err := a.benchEnv(cmd, admin, sched, auditor)
			if err != nil {
				return err
			}
			defer closeEnv()
			missing, err := loadgen.Verify(cmd.Context(), env, acks)
			if err != nil {
				return statusErr(err)
			}
			if len(missing) > 0 {
				return fmt.Errorf("%d of %d acknowledged grant(s) missing from the audit log, e.g. %s", len(missing), len(acks), missing[0])
			}
			fmt.Fprintf(a.stdout, "all %d acknowledged grants are in the log at their answered index\n", len(acks))
			return nil
		},
	}
	verify.Flags().StringVar(&acksFile, "acks", "", "the acks file")
	verify.Flags().StringVar(&auditor, "auditor-identity", "auditor", "dev identity reading the audit log")
	verify.MarkFlagRequired("acks")
	cmd.AddCommand(connect, verify, a.benchFloorServerCmd())
	return cmd
}

// benchEnv connects the admin, scheduler and auditor dev identities and
// loads the dev CA that mints node SVIDs.
func (a *app) benchEnv(cmd *cobra.Command, admin, sched, auditor string) (loadgen.Env, func(), error) {
	var env loadgen.Env
	if a.id.DevDir == "" {
		return env, nil, errors.New("bench needs --dev-dir (the node SVIDs are minted by the dev CA)")
	}
	ca, err := devca.Load(filepath.Join(a.id.DevDir, "ca"))
	if err != nil {
		return env, nil, err
	}
	env.CA = ca
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, d := range []struct {
		who  string
		conn **grpc.ClientConn
	}{{admin, &env.Admin}, {sched, &env.Scheduler}, {auditor, &env.Auditor}} {
		conn, src, err := clientconn.Dial(cmd.Context(), clientconn.Options{Addr: a.id.Addr, DevDir: a.id.DevDir, DevIdentity: d.who, ServerID: a.id.ServerID})
		if err != nil {
			closeAll()
			return env, nil, err
		}
		*d.conn = conn
		closers = append(closers, func() { conn.Close(); src.Close() })
	}
	env.Addr = a.id.Addr
	if env.Addr == "" {
		if env.Addr, err = clientconn.DevAddr(a.id.DevDir); err != nil {
			closeAll()
			return env, nil, err
		}
	}
	return env, closeAll, nil
}
