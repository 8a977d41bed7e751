package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// slurmCluster is a one-node Slurm 22.05 cluster of this machine, with its
// own munged, ports and state, started for one test.
type slurmCluster struct {
	conf, dir, host string
}

// startSlurm starts munged, slurmctld and slurmd (Debian's packages, as
// root: munged runs as its user) with the hooks in hookDir, and waits
// until the node is idle. Without Slurm the test is skipped, except
// under CI, where scripts/deps.sh installs it.
func startSlurm(t *testing.T, hookDir string) *slurmCluster {
	t.Helper()
	for _, p := range []string{"slurmctld", "slurmd", "munged", "mungekey", "sbatch"} {
		if _, err := exec.LookPath(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed under CI (scripts/deps.sh installs Slurm)", p)
			}
			t.Skipf("%s is not installed (apt-get install slurmctld slurmd slurm-client munge)", p)
		}
	}
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the Slurm tier runs as root (munged runs as its own user, slurmd as root)")
		}
		t.Skip("the Slurm tier runs as root")
	}
	// munged checks its directory's owner and modes: one of its own,
	// outside the test's 0700 temp dir.
	mdir, err := os.MkdirTemp("", "nvmegate-munge-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(mdir) })
	// Every client must reach the socket: the directory is searchable by all.
	if err := os.Chmod(mdir, 0o711); err != nil {
		t.Fatal(err)
	}
	run(t, "chown", "munge:munge", mdir)
	run(t, "runuser", "-u", "munge", "--", "mungekey", "-c", "-f", "-k", filepath.Join(mdir, "munge.key"), "-b", "1024")
	sock := filepath.Join(mdir, "munge.sock")
	run(t, "runuser", "-u", "munge", "--", "munged", "--socket="+sock, "--key-file="+filepath.Join(mdir, "munge.key"),
		"--pid-file="+filepath.Join(mdir, "munged.pid"), "--log-file="+filepath.Join(mdir, "munged.log"), "--seed-file="+filepath.Join(mdir, "seed"))
	t.Cleanup(func() {
		if pid, err := os.ReadFile(filepath.Join(mdir, "munged.pid")); err == nil {
			exec.Command("kill", strings.TrimSpace(string(pid))).Run()
		}
	})

	dir := t.TempDir()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	for _, d := range []string{"spool", "state", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The one node is named as the dev trust domain's node acme-gpu-1
	// (slurmd -N), so that the job's script can connect as it.
	c := &slurmCluster{conf: filepath.Join(dir, "slurm.conf"), dir: dir, host: "acme-gpu-1"}
	conf := fmt.Sprintf(`ClusterName=nvmegate-test
SlurmctldHost=%[1]s
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[2]s
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
ReturnToService=2
JobRequeue=1
SlurmctldPort=%[3]d
SlurmdPort=%[4]d
SlurmdSpoolDir=%[5]s/spool
StateSaveLocation=%[5]s/state
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd.log
MailProg=/bin/true
PrologSlurmctld=%[6]s/nvmegate-prolog-slurmctld
EpilogSlurmctld=%[6]s/nvmegate-epilog-slurmctld
NodeName=acme-gpu-1 NodeHostname=%[1]s NodeAddr=127.0.0.1 CPUs=%[7]d State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`, host, sock, freePort(t), freePort(t), dir, hookDir, runtime.NumCPU())
	if err := os.WriteFile(c.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"slurmctld", "slurmd"} {
		args := []string{"-D", "-f", c.conf}
		if d == "slurmctld" {
			args = append(args, "-c") // no saved state
		} else {
			args = append(args, "-N", "acme-gpu-1")
		}
		cmd := exec.Command(d, args...)
		cmd.Env = append(os.Environ(), "SLURM_CONF="+c.conf)
		out, err := os.Create(filepath.Join(dir, "log", d+".out"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
			out.Close()
		})
	}
	c.waitFor(t, "the node to be idle", 60*time.Second, func() (bool, string) {
		out, _ := c.slurm(t, "sinfo", "-h", "-o", "%t")
		return strings.TrimSpace(out) == "idle", out
	})
	return c
}

// slurm runs a Slurm command against the cluster.
func (c *slurmCluster) slurm(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.conf)
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// field is Key's value in `scontrol show job -o ID`.
func (c *slurmCluster) field(t *testing.T, id, key string) string {
	t.Helper()
	out, _ := c.slurm(t, "scontrol", "show", "job", "-o", id)
	// AdminComment and Comment run to the next " Key=": cut there.
	_, rest, ok := strings.Cut(" "+out, " "+key+"=")
	if !ok {
		return ""
	}
	end := len(rest)
	for i := 0; i+1 < len(rest); i++ {
		if rest[i] == ' ' {
			if k, _, ok := strings.Cut(rest[i+1:], "="); ok && k != "" && !strings.ContainsAny(k, " :") && strings.ToUpper(k[:1]) == k[:1] {
				end = i
				break
			}
		}
	}
	return strings.TrimSpace(rest[:end])
}

// waitFor polls cond until it holds, failing with what it last saw.
func (c *slurmCluster) waitFor(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "log", "slurmctld.log"))
	t.Fatalf("waited %v for %s; last saw: %s\nslurmctld.log:\n%s", limit, what, last, log)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// A real Slurm cluster with nvmegate's controller hooks, and nothing else
// written for it: a job that asks for a dataset in its --comment is
// admitted under its Slurm job ID, with its node (by the hostlist Slurm
// gives) and its user, and its script connects as that node; a requeue
// ends the run and its grant and admits the next under a new generation;
// scancel ends that one's grant and its host leaves the target; a job
// asking for another tenant's dataset, or for one outside the cluster's
// regions, is cancelled with the reason in AdminComment, not requeued; a
// job that asks for nothing runs as before. (The node's own hooks, which
// need the kernel, run in the VM tier: e2e/vm/story.sh.)
func TestSlurmControllerHooks(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: runs Slurm and the binaries")
	}
	bin := buildBinaries(t)
	dev := t.TempDir()
	startGateway(t, bin, dev)
	admin := func(args ...string) string {
		t.Helper()
		out, err := cli(t, bin, dev, "admin", args...)
		if err != nil {
			t.Fatalf("nvmegate %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	admin("inventory", "target", "add", "stor-eu-1", "--fabric", "fab-eu", "--region", "eu-west", "--driver", "nvmet",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420,secure=none")
	admin("inventory", "target", "add", "stor-us-1", "--fabric", "fab-us", "--region", "us-east", "--driver", "nvmet",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.1.10,service=4420,secure=none")
	admin("inventory", "subsystem", "add", "nqn.2026-01.io.example:acme-train", "--target", "stor-eu-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	admin("inventory", "subsystem", "add", "nqn.2026-01.io.example:globex-ckpt", "--target", "stor-us-1", "--tenant", "globex", "--ports", "1", "--dhchap")
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:acme-train", "1", "--tenant", "acme", "--region", "eu-west",
		"--class", "internal", "--dataset", "common-crawl/2026-10", "--digest", digest)
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:globex-ckpt", "1", "--tenant", "globex", "--region", "us-east",
		"--class", "internal", "--dataset", "globex/checkpoints", "--digest", digest)
	admin("inventory", "subsystem", "add", "nqn.2026-01.io.example:acme-us", "--target", "stor-us-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:acme-us", "1", "--tenant", "acme", "--region", "us-east",
		"--class", "internal", "--dataset", "acme/us-logs", "--digest", digest)

	// The dev gateway's own target agent programs stor-eu-1's nvmet tree
	// in a directory: the job's node connects, so its grants are real.
	tree := filepath.Join(dev, "state", "configfs", "stor-eu-1")

	// The site's part: two links and the hooks' configuration.
	hooks := t.TempDir()
	for _, h := range []string{"nvmegate-prolog-slurmctld", "nvmegate-epilog-slurmctld"} {
		if err := os.Symlink(filepath.Join(bin, "nvmegate"), filepath.Join(hooks, h)); err != nil {
			t.Fatal(err)
		}
	}
	scontrol, err := exec.LookPath("scontrol")
	if err != nil {
		t.Fatal(err)
	}
	squeue, err := exec.LookPath("squeue")
	if err != nil {
		t.Fatal(err)
	}
	c := startSlurm(t, hooks)
	if err := os.WriteFile(filepath.Join(hooks, "nvmegate-slurm.conf"), fmt.Appendf(nil,
		"tenant = acme\nregions = eu-west\nslurm-conf = %s\nscontrol = %s\nsqueue = %s\ndev-dir = %s\ndev-identity = acme-scheduler\n",
		c.conf, scontrol, squeue, dev), 0o644); err != nil {
		t.Fatal(err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	node := "spiffe://nvmegate.test/node/" + c.host

	// gatewayJob is job id as the gateway has it (found false: NotFound).
	type gwJob struct {
		JobID      string   `json:"job_id"`
		Tenant     string   `json:"tenant"`
		Nodes      []string `json:"nodes"`
		State      string   `json:"state"`
		Generation int      `json:"generation"`
		User       string   `json:"user"`
	}
	gatewayJob := func(id string) (j gwJob, found bool, out string) {
		out, err := cli(t, bin, dev, "admin", "-o", "json", "job", "get", id)
		if err != nil {
			if !strings.Contains(out, "NotFound") {
				t.Fatalf("job get %s: %v\n%s", id, err, out)
			}
			return j, false, out
		}
		var resp struct{ Job gwJob }
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("job get %s: %v\n%s", id, err, out)
		}
		return resp.Job, true, out
	}
	waitJob := func(id, what, state string, gen int) gwJob {
		t.Helper()
		var j gwJob
		c.waitFor(t, "job "+id+" "+what, 60*time.Second, func() (bool, string) {
			var found bool
			var out string
			j, found, out = gatewayJob(id)
			return found && j.State == state && j.Generation == gen, out
		})
		return j
	}

	// activeGrants lists the job's active grants at the gateway.
	activeGrants := func(id string) []string {
		t.Helper()
		out, err := cli(t, bin, dev, "admin", "-o", "json", "grants", "list", "--job", id, "--state", "active")
		if err != nil {
			t.Fatalf("grants list: %v\n%s", err, out)
		}
		var resp struct {
			Grants []struct {
				GrantID string `json:"grant_id"`
			}
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("grants list: %v\n%s", err, out)
		}
		var ids []string
		for _, g := range resp.Grants {
			ids = append(ids, g.GrantID)
		}
		return ids
	}
	waitGrants := func(id, what string, n int) {
		t.Helper()
		c.waitFor(t, "job "+id+" "+what, 60*time.Second, func() (bool, string) {
			g := activeGrants(id)
			return len(g) == n, fmt.Sprint(g)
		})
	}
	// The job's script connects as its node, then trains.
	script := fmt.Sprintf("%s --dev-dir %s --dev-identity acme-node-1 connect --job $SLURM_JOB_ID --subsystem nqn.2026-01.io.example:acme-train >/dev/null && sleep 120",
		filepath.Join(bin, "nvmegate"), dev)
	out, err := c.slurm(t, "sbatch", "--parsable", "--comment", "train run nvmegate:common-crawl/2026-10", "-t", "10", "--wrap", script)
	if err != nil {
		t.Fatalf("sbatch: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	t.Logf("sbatch --comment 'train run nvmegate:common-crawl/2026-10' -t 10: job %s", id)
	j := waitJob(id, "admitted", "JOB_STATE_ACTIVE", 0)
	t.Logf("PrologSlurmctld admitted job %s generation %d: tenant %s, nodes %v, user %s", j.JobID, j.Generation, j.Tenant, j.Nodes, j.User)
	if j.JobID != id || len(j.Nodes) != 1 || j.Nodes[0] != node || j.User != me.Username || j.Tenant != "acme" {
		t.Fatalf("admitted %+v; want job %s of acme, node %s, user %s", j, id, node, me.Username)
	}

	running := func(id string) {
		t.Helper()
		c.waitFor(t, "job "+id+" to run", 60*time.Second, func() (bool, string) {
			st := c.field(t, id, "JobState")
			return st == "RUNNING", st
		})
	}
	// Requeue: the killed run's epilog finishes generation 0; the next
	// run is admitted as generation 1. (A job requeued before it runs may
	// get no epilog: the next admission then ends generation 0 itself.)
	running(id)
	waitGrants(id, "connected", 1)
	allowed := filepath.Join(tree, "subsystems", "nqn.2026-01.io.example:acme-train", "allowed_hosts", "*")
	if hosts, _ := filepath.Glob(allowed); len(hosts) != 1 {
		all, _ := exec.Command("find", tree).CombinedOutput()
		t.Fatalf("the target allows %v while the job's node is connected; the tree:\n%s", hosts, all)
	}
	if out, err := c.slurm(t, "scontrol", "requeue", id); err != nil {
		t.Fatalf("requeue: %v\n%s", err, out)
	}
	waitJob(id, "finished by the requeue", "JOB_STATE_FINISHED", 0)
	waitGrants(id, "with run 0's grant ended", 0)
	t.Logf("scontrol requeue %s: the killed run's EpilogSlurmctld finished generation 0; its grant ended", id)
	// slurmctld puts the job back in the queue only once the killed run
	// has completed, after its epilog, and then holds it for the
	// credential's lifetime (BeginTime). Release it each time it is seen
	// held: a release sent before the requeue completes is overwritten.
	c.waitFor(t, "job "+id+" admitted again as generation 1", 60*time.Second, func() (bool, string) {
		if c.field(t, id, "JobState") == "PENDING" && c.field(t, id, "Reason") == "BeginTime" {
			if out, err := c.slurm(t, "scontrol", "update", "jobid="+id, "StartTime=now"); err != nil {
				t.Fatalf("release the requeued job: %v\n%s", err, out)
			}
		}
		j, found, out := gatewayJob(id)
		return found && j.State == "JOB_STATE_ACTIVE" && j.Generation == 1, out
	})
	running(id)
	waitGrants(id, "connected again", 1)
	t.Logf("scontrol update jobid=%s StartTime=now: PrologSlurmctld admitted generation 1; its node connected again", id)
	if out, err := c.slurm(t, "scancel", id); err != nil {
		t.Fatalf("scancel: %v\n%s", err, out)
	}
	waitJob(id, "finished by scancel", "JOB_STATE_FINISHED", 1)
	waitGrants(id, "with every grant ended by scancel", 0)
	c.waitFor(t, "the host to leave the target", 30*time.Second, func() (bool, string) {
		hosts, _ := filepath.Glob(allowed)
		return len(hosts) == 0, fmt.Sprint(hosts)
	})
	t.Logf("scancel %s: EpilogSlurmctld finished generation 1; its grant ended and its host left stor-eu-1", id)
	// What an auditor sees of the Slurm job: its lineage names the run,
	// the user and the node, and verifies offline; the report takes the
	// Slurm job ID.
	exp := filepath.Join(t.TempDir(), "export")
	if out, err := cli(t, bin, dev, "auditor", "audit", "export", "--out", exp); err != nil {
		t.Fatalf("audit export: %v\n%s", err, out)
	}
	key := filepath.Join(exp, "keys", "v1.pem")
	lin, err := cli(t, bin, dev, "auditor", "attest", "lineage", "--job", id)
	if err != nil {
		t.Fatalf("attest lineage: %v\n%s", err, lin)
	}
	linFile := filepath.Join(t.TempDir(), "lineage.json")
	os.WriteFile(linFile, []byte(lin), 0o600)
	ver, err := exec.Command(filepath.Join(bin, "nvmegate"), "attest", "verify", linFile, "--key", key).CombinedOutput()
	if err != nil || !strings.Contains(string(ver), "job:       "+id+" generation 1 (tenant acme, user "+me.Username+")") ||
		!strings.Contains(string(ver), node) || !strings.Contains(string(ver), "result:    OK") {
		t.Fatalf("attest verify of the lineage: %v\n%s", err, ver)
	}
	t.Logf("nvmegate attest verify (the job's lineage, offline):\n%s", ver)
	html := filepath.Join(t.TempDir(), "report.html")
	if out, err := cli(t, bin, dev, "auditor", "audit", "report", "--job", id, "--export", exp, "--key", key, "--html", html); err != nil {
		t.Fatalf("audit report --job %s: %v\n%s", id, err, out)
	}
	if b, err := os.ReadFile(html); err != nil || !strings.Contains(string(b), id) {
		t.Fatalf("the report of job %s: %v", id, err)
	}
	audit, err := cli(t, bin, dev, "auditor", "audit", "query", "--job", id)
	if err != nil || !strings.Contains(audit, "jobs.admit "+id+" generation 1") || !strings.Contains(audit, "jobs.finish "+id+" generation 1") {
		t.Fatalf("the log does not keep the generations apart: %v\n%s", err, audit)
	}

	// Another tenant's dataset: cancelled, with the reason, not requeued.
	out, err = c.slurm(t, "sbatch", "--parsable", "--comment", "nvmegate:globex/checkpoints", "-t", "10", "--wrap", "true")
	if err != nil {
		t.Fatalf("sbatch: %v\n%s", err, out)
	}
	bad := strings.TrimSpace(out)
	c.waitFor(t, "the refused job to be cancelled", 60*time.Second, func() (bool, string) {
		st := c.field(t, bad, "JobState")
		return st == "CANCELLED", st
	})
	ac := c.field(t, bad, "AdminComment")
	if !strings.Contains(ac, "dataset globex/checkpoints is not in tenant acme's inventory") {
		t.Fatalf("AdminComment %q does not say why", ac)
	}
	t.Logf("sbatch --comment nvmegate:globex/checkpoints: job %s %s, Requeue=%s, AdminComment=%s", bad, c.field(t, bad, "JobState"), c.field(t, bad, "Requeue"), ac)
	if rq := c.field(t, bad, "Requeue"); rq != "0" {
		t.Fatalf("the refused job is still requeueable (Requeue=%s): it would loop", rq)
	}
	if _, found, out := gatewayJob(bad); found {
		t.Fatalf("a refused job is in the gateway: %s", out)
	}

	// Acme's own dataset outside the cluster's regions: policy refuses it
	// (residency), and its reason is what the operator reads.
	out, err = c.slurm(t, "sbatch", "--parsable", "--comment", "nvmegate:acme/us-logs", "-t", "10", "--wrap", "true")
	if err != nil {
		t.Fatalf("sbatch: %v\n%s", err, out)
	}
	far := strings.TrimSpace(out)
	c.waitFor(t, "the job outside its regions to be cancelled", 60*time.Second, func() (bool, string) {
		st := c.field(t, far, "JobState")
		return st == "CANCELLED", st
	})
	ac = c.field(t, far, "AdminComment")
	if !strings.Contains(ac, "is in region us-east, which job "+far+" does not allow") {
		t.Fatalf("AdminComment %q does not give the policy's reason", ac)
	}
	t.Logf("sbatch --comment nvmegate:acme/us-logs: job %s %s, AdminComment=%s", far, c.field(t, far, "JobState"), ac)

	// A job that does not ask runs as before.
	out, err = c.slurm(t, "sbatch", "--parsable", "-t", "10", "--wrap", "true")
	if err != nil {
		t.Fatalf("sbatch: %v\n%s", err, out)
	}
	plain := strings.TrimSpace(out)
	c.waitFor(t, "the plain job to complete", 60*time.Second, func() (bool, string) {
		st := c.field(t, plain, "JobState")
		return st == "COMPLETED", st
	})
	if _, found, out := gatewayJob(plain); found {
		t.Fatalf("a job that asked for nothing is in the gateway: %s", out)
	}
	t.Logf("sbatch without the comment: job %s COMPLETED, unknown to the gateway", plain)
}
