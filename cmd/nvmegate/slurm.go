package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/dataset"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/slurm"
)

// Slurm runs a hook program with no arguments, so each hook is also a
// name this binary answers to (a link to it, named as below, in the
// directory slurm.conf points at), and its configuration is a file: the
// one beside the link, else the system's.
var slurmHooks = map[string][]string{
	"nvmegate-prolog-slurmctld": {"slurm", "prolog-slurmctld"},
	"nvmegate-epilog-slurmctld": {"slurm", "epilog-slurmctld"},
}

const (
	slurmConfigName   = "nvmegate-slurm.conf"
	slurmSystemConfig = "/etc/nvmegate/slurm.conf"
)

// hookArgs are the arguments a hook link stands for, or nil.
func hookArgs(argv0 string) []string {
	args, ok := slurmHooks[filepath.Base(argv0)]
	if !ok {
		return nil
	}
	conf := filepath.Join(filepath.Dir(argv0), slurmConfigName)
	if _, err := os.Stat(conf); err != nil {
		conf = slurmSystemConfig
	}
	return append(args, "--config", conf)
}

func (a *app) slurmCmd() *cobra.Command {
	var conf string
	cmd := &cobra.Command{
		Use:   "slurm",
		Short: "Slurm's job hooks: PrologSlurmctld admits the job's datasets, EpilogSlurmctld finishes it",
		Long: `Slurm's job hooks. Link this binary as the hooks slurm.conf names:

  PrologSlurmctld=/usr/local/libexec/nvmegate/nvmegate-prolog-slurmctld
  EpilogSlurmctld=/usr/local/libexec/nvmegate/nvmegate-epilog-slurmctld

and write the hooks' configuration in nvmegate-slurm.conf beside the links
(or /etc/nvmegate/slurm.conf): the tenant, the regions, and how to reach the
gateway as the scheduler's SPIFFE identity. A job asks for datasets with

  sbatch --comment 'nvmegate:common-crawl/2026-10,ckpt/llm-7:rw' ...

A refusal stops the job with the reason in scontrol show job's AdminComment,
and it is not requeued; a gateway that does not answer leaves the job to
Slurm's retry.`,
	}
	cmd.PersistentFlags().StringVar(&conf, "config", slurmSystemConfig, "the hooks' configuration file")
	cmd.AddCommand(
		&cobra.Command{
			Use: "prolog-slurmctld", Short: "Admit the job's scope: its nodes, the datasets its --comment asks for, until its time limit",
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return a.prologSlurmctld(cmd, conf) },
		},
		&cobra.Command{
			Use: "epilog-slurmctld", Short: "Finish the job's run: its grants end and its hosts leave the targets",
			Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return a.epilogSlurmctld(cmd, conf) },
		},
	)
	return cmd
}

// slurmSetup reads the hooks' configuration into the app's identity
// flags, and the job from the hook's environment.
func (a *app) slurmSetup(path string) (slurm.Config, slurm.Job, error) {
	fs := flag.NewFlagSet("identity", flag.ContinueOnError)
	a.id.AddFlags(fs, "")
	var keys []string
	fs.VisitAll(func(f *flag.Flag) { keys = append(keys, f.Name) })
	f, err := os.Open(path)
	if err != nil {
		return slurm.Config{}, slurm.Job{}, err
	}
	defer f.Close()
	cfg, err := slurm.ParseConfig(f, keys)
	if err != nil {
		return cfg, slurm.Job{}, fmt.Errorf("%s: %w", path, err)
	}
	for k, v := range cfg.Identity {
		if err := fs.Set(k, v); err != nil {
			return cfg, slurm.Job{}, fmt.Errorf("%s: %s: %w", path, k, err)
		}
	}
	job, err := slurm.JobFromEnv(os.Getenv)
	return cfg, job, err
}

func (a *app) prologSlurmctld(cmd *cobra.Command, path string) error {
	cfg, job, err := a.slurmSetup(path)
	if err != nil {
		return err
	}
	datasets, err := slurm.ParseComment(job.Comment)
	if err != nil {
		return refuseJob(cfg, job, err.Error())
	}
	if datasets == nil {
		return nil // the job does not use nvmegate
	}
	expires, err := jobExpiry(cfg, job)
	if err != nil {
		return err // Slurm retries
	}
	return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
		nss, err := dataset.Resolve(ctx, pb.NewInventoryClient(c), cfg.Tenant, datasets)
		if err != nil {
			return slurmAnswer(cfg, job, err)
		}
		resp, err := pb.NewJobsClient(c).Admit(ctx, &pb.AdmitRequest{JobId: job.ID, Tenant: cfg.Tenant, Hostlist: job.Nodes,
			Namespaces: nss, AllowedRegions: cfg.Regions, ExpiresAt: timestamppb.New(expires),
			Generation: job.Restarts, User: job.User})
		if err != nil {
			return slurmAnswer(cfg, job, err)
		}
		fmt.Fprintf(a.stdout, "nvmegate: job %s generation %d admitted: %d node(s), %d namespace(s), until %s (decision %s)\n",
			job.ID, resp.Job.Generation, len(resp.Job.Nodes), len(resp.Job.Namespaces), expires.UTC().Format(time.RFC3339), resp.Decision.GetId())
		return nil
	})
}

func (a *app) epilogSlurmctld(cmd *cobra.Command, path string) error {
	_, job, err := a.slurmSetup(path)
	if err != nil {
		return err
	}
	if ds, err := slurm.ParseComment(job.Comment); err == nil && ds == nil {
		return nil // the job did not use nvmegate
	}
	return a.call(cmd, func(ctx context.Context, c *grpc.ClientConn) error {
		// The killed run of a requeued job already has the next restart
		// count: Finish ends this generation or an earlier one.
		gen := job.Restarts
		resp, err := pb.NewJobsClient(c).Finish(ctx, &pb.FinishRequest{JobId: job.ID, Generation: &gen, Reason: "the Slurm job ended"})
		if status.Code(err) == codes.NotFound {
			return nil // never admitted: its prolog refused it
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "nvmegate: job %s generation %d %s; %d grant(s) ended\n", job.ID, resp.Job.Generation,
			strings.ToLower(strings.TrimPrefix(resp.Job.State.String(), "JOB_STATE_")), len(resp.EndedGrantIds))
		return nil
	})
}

// jobExpiry is the end of the job's scope: its run's start plus its time
// limit and the margin, as squeue reports them (the same on every retry of
// the hook, so a retried admission names the same scope).
func jobExpiry(cfg slurm.Config, job slurm.Job) (time.Time, error) {
	out, err := slurmCommand(cfg, cfg.Squeue, "-h", "-j", job.ID, "-o", slurm.SqueueFormat).Output()
	if err != nil {
		return time.Time{}, fmt.Errorf("squeue -j %s: %w", job.ID, err)
	}
	w, err := slurm.ParseSqueue(string(out), time.Local)
	if err != nil {
		return time.Time{}, fmt.Errorf("squeue -j %s: %w", job.ID, err)
	}
	if w.Unlimited {
		return w.Start.Add(cfg.UnlimitedExpiry), nil
	}
	return w.Start.Add(w.Limit + cfg.ExpiryMargin), nil
}

// slurmAnswer turns the gateway's answer into the hook's: a refusal stops
// the job (refuseJob); a gateway that does not answer leaves it to
// Slurm's retry, saying so where the operator looks.
func slurmAnswer(cfg slurm.Config, job slurm.Job, err error) error {
	var unknown dataset.UnknownError
	if errors.As(err, &unknown) {
		return refuseJob(cfg, job, err.Error())
	}
	switch st := status.Convert(err); st.Code() {
	case codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition, codes.AlreadyExists, codes.NotFound:
		return refuseJob(cfg, job, st.Message())
	default:
		msg := fmt.Sprintf("nvmegate: the gateway did not answer (%s: %s); Slurm retries the job", st.Code(), st.Message())
		_ = scontrolUpdate(cfg, job, "AdminComment="+clipComment(msg))
		return errors.New(msg)
	}
}

// refuseJob stops the job: the reason goes where scontrol show job shows
// it (AdminComment), and the job is made not requeueable, so that the
// failing prolog cancels it instead of retrying it every two minutes.
func refuseJob(cfg slurm.Config, job slurm.Job, reason string) error {
	msg := "nvmegate refused the job's datasets: " + reason
	err := errors.Join(scontrolUpdate(cfg, job, "AdminComment="+clipComment(msg)), scontrolUpdate(cfg, job, "Requeue=0"))
	if err != nil {
		return fmt.Errorf("%s (and the job could not be marked: %w)", msg, err)
	}
	return errors.New(msg)
}

func scontrolUpdate(cfg slurm.Config, job slurm.Job, field string) error {
	if out, err := slurmCommand(cfg, cfg.Scontrol, "update", "jobid="+job.ID, field).CombinedOutput(); err != nil {
		return fmt.Errorf("scontrol update %s: %v: %s", strings.SplitN(field, "=", 2)[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

// slurmCommand runs a Slurm client: a hook's environment has no
// SLURM_CONF, so the configured one is given.
func slurmCommand(cfg slurm.Config, name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env = append(os.Environ(), "SLURM_CONF="+cfg.SlurmConf)
	return c
}

// clipComment keeps an AdminComment readable.
func clipComment(s string) string {
	if len(s) > 1000 {
		return s[:1000] + "…"
	}
	return s
}
