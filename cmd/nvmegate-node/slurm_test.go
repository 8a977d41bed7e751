package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/slurm"
)

// nodeHookEnv sets a hook's job environment for the test.
func nodeHookEnv(t *testing.T, id, comment string) {
	t.Setenv("SLURM_JOB_ID", id)
	t.Setenv("SLURM_JOB_COMMENT", comment)
	t.Setenv("SLURM_JOB_NODELIST", "gpu01")
	t.Setenv("SLURM_JOB_RESTART_COUNT", "0")
}

func nodeHookConfig(t *testing.T) (conf, runDir string) {
	dir := t.TempDir()
	conf, runDir = filepath.Join(dir, nodeConfigName), filepath.Join(dir, "jobs")
	if err := os.WriteFile(conf, []byte("dev-dir = /nonexistent\ndev-identity = acme-node-1\nrun-dir = "+runDir+"\nconnect-timeout = 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return conf, runDir
}

// The links name the hooks; their configuration is the one beside them
// when there is one.
func TestNodeHookArgs(t *testing.T) {
	conf, _ := nodeHookConfig(t)
	link := filepath.Join(filepath.Dir(conf), "nvmegate-node-prolog")
	if got := nodeHookArgs(link); strings.Join(got, " ") != "slurm prolog --config "+conf {
		t.Fatalf("nodeHookArgs = %v", got)
	}
	if got := nodeHookArgs("/usr/libexec/nvmegate-node-epilog"); strings.Join(got, " ") != "slurm epilog --config "+nodeSystemConfig {
		t.Fatalf("nodeHookArgs without a config beside = %v", got)
	}
	if nodeHookArgs("/usr/bin/nvmegate-node") != nil {
		t.Fatal("the binary's own name taken for a hook")
	}
}

// A job that asks for no dataset (or asks malformed: the controller's
// hook refused it) makes the node's hooks do nothing and succeed: a failing
// Prolog would drain the node.
func TestNodeHooksIdleForJobsThatAskNothing(t *testing.T) {
	conf, runDir := nodeHookConfig(t)
	for _, comment := range []string{"", "a note", "nvmegate:"} {
		nodeHookEnv(t, "41", comment)
		var out bytes.Buffer
		if err := nodeProlog(t.Context(), conf, &out); err != nil || out.Len() != 0 {
			t.Fatalf("prolog for comment %q: %v, %q", comment, err, out.String())
		}
		if err := nodeTaskProlog(conf, &out); err != nil || out.Len() != 0 {
			t.Fatalf("task prolog for comment %q: %v, %q", comment, err, out.String())
		}
		if err := nodeEpilog(conf, &out); err != nil {
			t.Fatalf("epilog for comment %q: %v", comment, err)
		}
	}
	if _, err := os.Stat(runDir); !os.IsNotExist(err) {
		t.Fatalf("the hooks made state for a job that asked nothing: %v", err)
	}
}

// The Prolog fails, naming why, when the agent cannot connect the job:
// here it cannot reach a gateway at all.
func TestNodePrologFailsWhenTheAgentCannot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the agent")
	}
	bin := filepath.Join(t.TempDir(), "nvmegate-node")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	conf, _ := nodeHookConfig(t)
	link := filepath.Join(filepath.Dir(conf), "nvmegate-node-prolog")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(link)
	cmd.Env = []string{"SLURM_JOB_ID=42", "SLURM_JOB_COMMENT=nvmegate:ds", "SLURM_JOB_NODELIST=gpu01"}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the node agent exited") || !strings.Contains(string(out), "dev") {
		t.Fatalf("prolog without a gateway: %v\n%s", err, out)
	}
}

// The TaskProlog prints what the Prolog published; the Epilog stops the
// job's own agent and no other process, and removes the job's state.
func TestNodeTaskPrologAndEpilog(t *testing.T) {
	conf, runDir := nodeHookConfig(t)
	nodeHookEnv(t, "43", "nvmegate:ds")
	dir := filepath.Join(runDir, "43")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(runDir, "43.devices"), []byte("/dev/nvme1n1,/dev/nvme2n1\n"), 0o600)
	var out bytes.Buffer
	if err := nodeTaskProlog(conf, &out); err != nil || out.String() != "export NVMEGATE_DEVICES=/dev/nvme1n1,/dev/nvme2n1\n" {
		t.Fatalf("task prolog: %v, %q", err, out.String())
	}

	// Another process under the pid file: left alone.
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	os.WriteFile(filepath.Join(dir, "agent.pid"), []byte(strconv.Itoa(other.Process.Pid)), 0o600)
	if err := nodeEpilog(conf, &out); err != nil {
		t.Fatal(err)
	}
	if !running(other.Process.Pid) {
		t.Fatal("the epilog stopped a process that is not the job's agent")
	}

	// The job's agent (a stand-in with its command line): stopped.
	os.MkdirAll(dir, 0o700)
	agent := exec.Command("sh", "-c", "sleep 60", "nvmegate-node", "--job", "43")
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { agent.Wait(); close(exited) }()
	os.WriteFile(filepath.Join(dir, "agent.pid"), []byte(strconv.Itoa(agent.Process.Pid)), 0o600)
	if err := nodeEpilog(conf, &out); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the epilog returned with the job's agent running")
	}
	for _, p := range []string{dir, filepath.Join(runDir, "43.devices")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("the job's state is left: %s: %v", p, err)
		}
	}
}

// The devices go to the job's user (slurmd runs TaskProlog and the job as
// that user), and so does the file naming them.
func TestPublishDevicesToTheJobsUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown needs root")
	}
	_, runDir := nodeHookConfig(t)
	os.MkdirAll(runDir, 0o755)
	dev := filepath.Join(t.TempDir(), "nvme9n1") // a stand-in for the block device
	os.WriteFile(dev, nil, 0o660)
	job := slurm.Job{ID: "44", UID: 4242}
	cfg := slurm.NodeConfig{RunDir: runDir}
	if err := publishDevices(cfg, job, []string{dev}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dev, devicesFile(cfg, job)} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 4242 {
			t.Errorf("%s is owned by %d, want the job's user 4242", p, uid)
		}
	}
	if fi, _ := os.Stat(devicesFile(cfg, job)); fi.Mode().Perm() != 0o600 {
		t.Errorf("the devices file is %v, want 0600", fi.Mode().Perm())
	}
}
