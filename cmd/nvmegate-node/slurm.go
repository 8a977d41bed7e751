package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nvmegate/nvmegate/slurm"
)

// The node's Slurm hooks are links to this binary, named as below; their
// configuration is nvmegate-node-slurm.conf beside the links, else the
// system's (slurmd runs a hook with no arguments and a bare environment).
var nodeHooks = map[string]string{
	"nvmegate-node-prolog":      "prolog",
	"nvmegate-node-task-prolog": "task-prolog",
	"nvmegate-node-epilog":      "epilog",
}

const (
	nodeConfigName   = "nvmegate-node-slurm.conf"
	nodeSystemConfig = "/etc/nvmegate/node-slurm.conf"
)

// nodeHookArgs are the arguments a hook link stands for, or nil.
func nodeHookArgs(argv0 string) []string {
	verb, ok := nodeHooks[filepath.Base(argv0)]
	if !ok {
		return nil
	}
	conf := filepath.Join(filepath.Dir(argv0), nodeConfigName)
	if _, err := os.Stat(conf); err != nil {
		conf = nodeSystemConfig
	}
	return []string{"slurm", verb, "--config", conf}
}

func slurmCmd(stdout io.Writer) *cobra.Command {
	var conf string
	cmd := &cobra.Command{
		Use:   "slurm",
		Short: "Slurm's node hooks: Prolog connects the job's datasets, TaskProlog exports their devices, Epilog disconnects",
		Long: `Slurm's node hooks. Link this binary as the hooks slurm.conf names:

  Prolog=/usr/local/libexec/nvmegate/nvmegate-node-prolog
  TaskProlog=/usr/local/libexec/nvmegate/nvmegate-node-task-prolog
  Epilog=/usr/local/libexec/nvmegate/nvmegate-node-epilog

For a job whose --comment asks for datasets (nvmegate:NAME,...), the Prolog
starts the node agent for the job and returns once every subsystem the job
lets this node reach is connected and its namespaces have block devices; the
TaskProlog exports NVMEGATE_DEVICES (comma-separated) to each task; the
Epilog stops the agent, which disconnects and releases the grants. The
Prolog fails only for the node's own faults (a failing Prolog drains the
node): the controller's hook refuses jobs.`,
	}
	cmd.PersistentFlags().StringVar(&conf, "config", nodeSystemConfig, "the hooks' configuration file")
	cmd.AddCommand(
		&cobra.Command{Use: "prolog", Short: "Start the job's node agent and wait until its namespaces are connected", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return nodeProlog(cmd.Context(), conf, stdout) }},
		&cobra.Command{Use: "task-prolog", Short: "Print the export line of the job's block devices", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return nodeTaskProlog(conf, stdout) }},
		&cobra.Command{Use: "epilog", Short: "Stop the job's node agent: it disconnects and releases the grants", Args: cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error { return nodeEpilog(conf, stdout) }},
	)
	return cmd
}

// devicesFile is where the Prolog publishes the job's block devices for
// its TaskProlog, which slurmd runs as the job's user: beside the job's
// root-only state, owned by that user, mode 0600.
func devicesFile(cfg slurm.NodeConfig, job slurm.Job) string {
	return filepath.Join(cfg.RunDir, job.ID+".devices")
}

// nodeJob reads the hooks' configuration and the job; use is false for a
// job that asks for no dataset (nothing to do).
func nodeJob(path string) (cfg slurm.NodeConfig, job slurm.Job, dir string, use bool, err error) {
	var keys []string
	run := runCmd(io.Discard)
	run.Flags().VisitAll(func(f *pflag.Flag) { keys = append(keys, f.Name) })
	f, err := os.Open(path)
	if err != nil {
		return cfg, job, "", false, err
	}
	defer f.Close()
	if cfg, err = slurm.ParseNodeConfig(f, keys); err != nil {
		return cfg, job, "", false, fmt.Errorf("%s: %w", path, err)
	}
	if job, err = slurm.JobFromEnv(os.Getenv); err != nil {
		return cfg, job, "", false, err
	}
	// A malformed request was the controller's to refuse; the node does
	// nothing for it rather than drain itself.
	ds, perr := slurm.ParseComment(job.Comment)
	dir = filepath.Join(cfg.RunDir, job.ID)
	return cfg, job, dir, perr == nil && ds != nil, nil
}

func nodeProlog(ctx context.Context, path string, stdout io.Writer) error {
	cfg, job, dir, use, err := nodeJob(path)
	if err != nil || !use {
		return err
	}
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// A Prolog run again for the job on this node (its Epilog failed)
	// waits on the agent already there rather than orphan it.
	if pid, ok := jobAgent(dir, job); ok {
		return waitConnected(ctx, cfg, job, dir, pid, nil, stdout)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	socket := filepath.Join(dir, "status.sock")
	args := []string{"run", "--job", job.ID, "--status-socket", socket}
	for _, k := range slices.Sorted(func(y func(string) bool) {
		for k := range cfg.Agent {
			if !y(k) {
				return
			}
		}
	}) {
		args = append(args, "--"+k+"="+cfg.Agent[k])
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	agent := exec.Command(self, args...)
	agent.Stdout, agent.Stderr = logf, logf
	// Its own session: it outlives this hook, and slurmd's signals to
	// the hook's group do not reach it.
	agent.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := agent.Start(); err != nil {
		return fmt.Errorf("start the node agent: %w", err)
	}
	pid := agent.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, "agent.pid"), []byte(strconv.Itoa(pid)), 0o600); err != nil {
		agent.Process.Kill()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	return waitConnected(ctx, cfg, job, dir, pid, exited, stdout)
}

// waitConnected waits until the job's agent (pid; exited, if it is this
// process's child) has every subsystem live with its block devices, then
// gives the devices to the job's user and publishes them.
func waitConnected(ctx context.Context, cfg slurm.NodeConfig, job slurm.Job, dir string, pid int, exited <-chan error, stdout io.Writer) error {
	socket := filepath.Join(dir, "status.sock")
	deadline := time.Now().Add(cfg.ConnectTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
			return fmt.Errorf("the node agent exited (%v) before the job's namespaces were connected:\n%s", err, tail(log))
		case <-time.After(200 * time.Millisecond):
		}
		st, _, err := fetchStatus(ctx, socket)
		if err != nil {
			last = err.Error()
			continue
		}
		var devs []string
		ready := len(st.Subsystems) > 0
		for _, s := range st.Subsystems {
			if s.State != "live" || len(s.Devices) == 0 {
				ready = false
				last = fmt.Sprintf("%s: state %q, %d device(s) %s", s.Subsystem, s.State, len(s.Devices), s.Error)
			}
			devs = append(devs, s.Devices...)
		}
		if !ready {
			continue
		}
		if err := publishDevices(cfg, job, devs); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "nvmegate-node: job %s connected: %s\n", job.ID, strings.Join(devs, ","))
		return nil
	}
	syscall.Kill(pid, syscall.SIGTERM)
	return fmt.Errorf("the job's namespaces were not connected in %v (last: %s)", cfg.ConnectTimeout, last)
}

// publishDevices gives the job's user its block devices (slurmd runs the
// job as that user; the kernel makes them root's) and writes their names
// where its TaskProlog reads them.
func publishDevices(cfg slurm.NodeConfig, job slurm.Job, devs []string) error {
	if job.UID >= 0 {
		for _, d := range devs {
			if err := os.Chown(d, job.UID, -1); err != nil {
				return fmt.Errorf("give %s to the job's user: %w", d, err)
			}
		}
	}
	path := devicesFile(cfg, job)
	if err := os.WriteFile(path, []byte(strings.Join(devs, ",")+"\n"), 0o600); err != nil {
		return err
	}
	if job.UID >= 0 {
		return os.Chown(path, job.UID, -1)
	}
	return nil
}

// jobAgent is the pid of the job's agent, if one runs (its pid file names
// a live process started for this job).
func jobAgent(dir string, job slurm.Job) (int, bool) {
	b, err := os.ReadFile(filepath.Join(dir, "agent.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !running(pid) || !bytes.Contains(cmdline, []byte("\x00--job\x00"+job.ID+"\x00")) {
		return 0, false
	}
	return pid, true
}

// nodeTaskProlog prints the line slurmd turns into the task's environment.
func nodeTaskProlog(path string, stdout io.Writer) error {
	cfg, job, _, use, err := nodeJob(path)
	if err != nil || !use {
		return err
	}
	devs, err := os.ReadFile(devicesFile(cfg, job))
	if err != nil {
		return fmt.Errorf("the Prolog published no devices: %w", err)
	}
	fmt.Fprintf(stdout, "export NVMEGATE_DEVICES=%s\n", strings.TrimSpace(string(devs)))
	return nil
}

// nodeEpilog stops the job's agent (SIGTERM: it disconnects, removes its
// keys and releases the grants) and waits for it to exit.
func nodeEpilog(path string, stdout io.Writer) error {
	cfg, job, dir, _, err := nodeJob(path)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil // no agent for this job on this node
	}
	// Only the job's own agent: a pid reused since is left alone.
	if pid, ok := jobAgent(dir, job); ok {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		deadline := time.Now().Add(2 * time.Minute)
		for running(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("the node agent (pid %d) did not stop in 2 minutes: the job's hosts may still be connected", pid)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "agent.log"))
	fmt.Fprintf(stdout, "nvmegate-node: job %s stopped\n%s", job.ID, tail(log))
	os.Remove(devicesFile(cfg, job))
	return os.RemoveAll(dir)
}

// running: process pid exists and has not exited (an orphan that exited
// stays a zombie until its new parent reaps it).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// tail is the last lines of a log, for a hook's message.
func tail(b []byte) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return strings.Join(lines, "\n") + "\n"
}
