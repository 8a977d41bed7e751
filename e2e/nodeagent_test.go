package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate/internal/clientconn"
	"github.com/nvmegate/nvmegate/internal/logbuf"
	"github.com/nvmegate/nvmegate/nodeagent"
	"github.com/nvmegate/nvmegate/nvmehost"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// targetKernel stands in for the host kernel, which cannot run NVMe-oF on
// this machine (the VM tiers run the real one): it takes the option
// strings /dev/nvme-fabrics takes, and authenticates a connect or a
// re-authentication as nvmet would, against the nvmet tree the gateway
// programmed: the subsystem must allow the host NQN, and the host's
// dhchap_key there must be the secret presented.
type targetKernel struct {
	cfs    string // the target's nvmet tree
	refuse error  // every connect fails with this (a fabric down)

	mu      sync.Mutex
	next    int
	ctrls   map[string]map[string]string // controller -> its options
	reauths []error
}

func (k *targetKernel) check(o map[string]string) error {
	for _, req := range []string{"nqn", "transport", "traddr", "trsvcid", "hostnqn", "hostid"} {
		if o[req] == "" {
			return fmt.Errorf("fabrics: missing %s: %w", req, syscall.EINVAL)
		}
	}
	if _, err := os.Lstat(filepath.Join(k.cfs, "subsystems", o["nqn"], "allowed_hosts", o["hostnqn"])); err != nil {
		return fmt.Errorf("nvmet: host not allowed: %w", syscall.EPERM)
	}
	key, err := os.ReadFile(filepath.Join(k.cfs, "hosts", o["hostnqn"], "dhchap_key"))
	if err != nil || strings.TrimSpace(string(key)) == "" || strings.TrimSpace(string(key)) != o["dhchap_secret"] {
		return fmt.Errorf("nvmet: authentication failed: %w", syscall.EKEYREJECTED)
	}
	return nil
}

func parseOptions(s string) (map[string]string, error) {
	o := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "nqn", "transport", "traddr", "trsvcid", "hostnqn", "hostid", "dhchap_secret", "dhchap_ctrl_secret", "tls", "keyring":
		default:
			return nil, fmt.Errorf("fabrics: unknown parameter %q: %w", k, syscall.EINVAL)
		}
		if _, dup := o[k]; dup {
			return nil, fmt.Errorf("fabrics: %s twice: %w", k, syscall.EINVAL)
		}
		o[k] = v
	}
	return o, nil
}

func (k *targetKernel) Connect(opts string) (nvmehost.Controller, error) {
	o, err := parseOptions(opts)
	if err != nil {
		return nvmehost.Controller{}, err
	}
	if k.refuse != nil {
		return nvmehost.Controller{}, k.refuse
	}
	if err := k.check(o); err != nil {
		return nvmehost.Controller{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	name := fmt.Sprintf("nvme%d", k.next)
	k.next++
	if k.ctrls == nil {
		k.ctrls = map[string]map[string]string{}
	}
	k.ctrls[name] = o
	return nvmehost.Controller{Name: name, CntlID: 1}, nil
}

// SetDHCHAP re-authenticates the live controller with the new secret; a
// failed re-authentication is recorded (the kernel logs it and keeps the
// controller).
func (k *targetKernel) SetDHCHAP(name, host, ctrl string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.ctrls[name]
	if !ok {
		return nvmehost.ErrNoController
	}
	o["dhchap_secret"], o["dhchap_ctrl_secret"] = host, ctrl
	k.reauths = append(k.reauths, k.check(o))
	return nil
}

func (k *targetKernel) Delete(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.ctrls[name]; !ok {
		return nvmehost.ErrNoController
	}
	delete(k.ctrls, name)
	return nil
}

func (k *targetKernel) Info(name string) (nvmehost.Info, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.ctrls[name]
	if !ok {
		return nvmehost.Info{}, nvmehost.ErrNoController
	}
	return nvmehost.Info{Name: name, State: "live", Transport: o["transport"], SubNQN: o["nqn"], HostNQN: o["hostnqn"]}, nil
}

func (k *targetKernel) Controllers() ([]nvmehost.Info, error) {
	k.mu.Lock()
	var names []string
	for n := range k.ctrls {
		names = append(names, n)
	}
	k.mu.Unlock()
	var out []nvmehost.Info
	for _, n := range names {
		if in, err := k.Info(n); err == nil {
			out = append(out, in)
		}
	}
	return out, nil
}

// Multipath: one block device per namespace, whatever the paths.
func (k *targetKernel) Multipath() bool { return true }

// Namespaces: a controller serves its subsystem's namespaces at once (the
// real kernel's scan lands later; nodeagent's own tests cover the wait).
func (k *targetKernel) Namespaces(name string) ([]string, error) {
	k.mu.Lock()
	o, ok := k.ctrls[name]
	k.mu.Unlock()
	if !ok {
		return nil, nvmehost.ErrNoController
	}
	ents, err := os.ReadDir(filepath.Join(k.cfs, "subsystems", o["nqn"], "namespaces"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

func (k *targetKernel) snapshot() (ctrls map[string]map[string]string, reauths []error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ctrls = map[string]map[string]string{}
	for n, o := range k.ctrls {
		c := map[string]string{}
		for a, v := range o {
			c[a] = v
		}
		ctrls[n] = c
	}
	return ctrls, append([]error(nil), k.reauths...)
}

// agentRun is one agent running in this process.
type agentRun struct {
	a      *nodeagent.Agent
	log    *logbuf.Buffer
	cancel context.CancelFunc
	done   chan error
}

func startNodeAgent(t *testing.T, dir, who, job string, k *targetKernel) *agentRun {
	t.Helper()
	conn, src, err := clientconn.Dial(context.Background(), clientconn.Options{DevDir: dir, DevIdentity: who})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); src.Close() })
	log := &logbuf.Buffer{}
	r := &agentRun{a: &nodeagent.Agent{Gateway: pb.NewAccessClient(conn), Kernel: k, Job: job, RenewEvery: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(log, nil))}, log: log, done: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
		scanBytes(t.Name()+": agent log "+who, []byte(log.String()))
	})
	return r
}

// waitStatus waits until the agent's status satisfies ok.
func waitStatus(t *testing.T, r *agentRun, what string, ok func(nodeagent.Status) bool) nodeagent.Status {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st := r.a.Status(); ok(st) {
			return st
		}
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("waiting for %s: the agent stopped: %v\n%s", what, err, r.log)
		default:
		}
	}
	t.Fatalf("waiting for %s: status %+v", what, r.a.Status())
	return nodeagent.Status{}
}

// The node agent against a real dev gateway that programs a real nvmet
// tree: it connects the job's subsystem with exactly the secret the target
// holds, re-keys the live controller after a rotation (the old secret no
// longer connects), serves its status to `nvmegate-node status`, and on
// shutdown deletes the controller and releases the grant (the host leaves
// the target); when the job finishes it disconnects by itself. A node the
// job does not name gets nothing.
func TestNodeAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "dev")
	startGateway(t, bin, dir)
	const sub = "nqn.2026-01.io.nvmegate.e2e:acme-node"
	node1 := "spiffe://nvmegate.test/node/acme-gpu-1"
	must := func(who string, args ...string) string {
		t.Helper()
		out, err := cli(t, bin, dir, who, args...)
		if err != nil {
			t.Fatalf("nvmegate %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	must("admin", "inventory", "target", "add", "stor-1", "--fabric", "fab-1", "--region", "eu-west", "--driver", "nvmet",
		"--port", "id=1,transport=tcp,family=ipv4,address=127.0.0.1,service=4420")
	must("admin", "inventory", "subsystem", "add", sub, "--target", "stor-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	must("admin", "inventory", "namespace", "add", sub, "1", "--tenant", "acme", "--region", "eu-west", "--class", "internal",
		"--dataset", "ds", "--digest", "sha256:"+strings.Repeat("ab", 32))
	hostNQN := strings.TrimSpace(must("admin", "hostnqn", node1))
	must("admin", "inventory", "host", "add", node1, "--nqn", hostNQN, "--tenant", "acme")
	must("acme-scheduler", "job", "admit", "job-1", "--tenant", "acme", "--node", node1, "--namespace", sub+"/1:rw", "--region", "eu-west", "--expires-in", "2h")
	cfs := filepath.Join(dir, "state", "configfs", "stor-1")
	k := &targetKernel{cfs: cfs}

	// A node the job does not name is refused at discovery and connects
	// nothing; so is another tenant's node.
	for _, who := range []string{"acme-node-2", "globex-node-1"} {
		r := startNodeAgent(t, dir, who, "job-1", k)
		select {
		case err := <-r.done:
			r.done <- err
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s on job-1: %v, want PermissionDenied", who, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s on job-1: still running", who)
		}
	}
	if c, _ := k.snapshot(); len(c) != 0 {
		t.Fatalf("controllers for nodes outside the job: %v", c)
	}

	// A grant the kernel cannot use is released at once: no grant stays
	// open (and no host on the target) for a connection that did not
	// happen. The agent keeps trying and says why in its status.
	down := &targetKernel{cfs: cfs, refuse: syscall.ECONNREFUSED}
	rd := startNodeAgent(t, dir, "acme-node-1", "job-1", down)
	st := waitStatus(t, rd, "the refused connect", func(s nodeagent.Status) bool {
		return len(s.Subsystems) == 1 && strings.Contains(s.Subsystems[0].Error, "connection refused")
	})
	if st.Subsystems[0].Grant != "" || st.Subsystems[0].Controller != "" {
		t.Fatalf("status after a refused connect: %+v", st.Subsystems[0])
	}
	rd.cancel()
	if err := <-rd.done; err != nil {
		t.Fatalf("shutdown after a refused connect: %v", err)
	}
	rd.done <- nil
	if out := must("admin", "grants", "list", "--job", "job-1", "--state", "active"); strings.Contains(out, "g-") {
		t.Fatalf("a grant stays active after the kernel refused the connect:\n%s", out)
	}
	if _, err := os.Lstat(filepath.Join(cfs, "subsystems", sub, "allowed_hosts", hostNQN)); !os.IsNotExist(err) {
		t.Fatalf("the host is allowed on the target after the kernel refused the connect (%v)", err)
	}

	r := startNodeAgent(t, dir, "acme-node-1", "job-1", k)
	st = waitStatus(t, r, "the connect", func(s nodeagent.Status) bool {
		return len(s.Subsystems) == 1 && s.Subsystems[0].Controller != "" && s.Subsystems[0].State == "live"
	})
	s0 := st.Subsystems[0]
	if st.HostNQN != hostNQN || s0.Subsystem != sub || s0.Grant == "" || s0.KeyVersion == 0 || s0.Expires.IsZero() {
		t.Fatalf("status after the connect: %+v", st)
	}
	ctrls, _ := k.snapshot()
	first := ctrls[s0.Controller]
	if first["hostnqn"] != hostNQN || first["traddr"] != "127.0.0.1" || first["trsvcid"] != "4420" {
		t.Fatalf("the kernel was asked for %v", first)
	}

	// The status command, on the socket the agent serves.
	sock := filepath.Join(t.TempDir(), "status.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(l, r.a.StatusHandler())
	defer l.Close()
	out, err := exec.Command(filepath.Join(bin, "nvmegate-node"), "status", "--status-socket", sock).CombinedOutput()
	if err != nil || !strings.Contains(string(out), s0.Grant) || !strings.Contains(string(out), "live") || !strings.Contains(string(out), "job job-1") {
		t.Fatalf("nvmegate-node status: %v\n%s", err, out)
	}
	scanBytes(t.Name()+": status", out)

	// A rotation reaches the node at its next renewal: the live controller
	// gets the new secret and re-authenticates with it; the old one no
	// longer connects.
	must("admin", "keys", "rotate", "--subsystem", sub, "--reason", "e2e")
	st = waitStatus(t, r, "the re-key", func(s nodeagent.Status) bool { return s.Subsystems[0].Rekeys == 1 })
	if st.Subsystems[0].KeyVersion <= s0.KeyVersion || st.Subsystems[0].Controller != s0.Controller || st.Subsystems[0].LastRekey.IsZero() {
		t.Fatalf("status after the rotation: %+v (before: %+v)", st.Subsystems[0], s0)
	}
	ctrls, reauths := k.snapshot()
	if len(reauths) != 1 || reauths[0] != nil {
		t.Fatalf("re-authentications after the rotation: %v", reauths)
	}
	if ctrls[s0.Controller]["dhchap_secret"] == first["dhchap_secret"] {
		t.Fatal("the live controller kept the old secret")
	}
	if err := k.check(first); !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("the old secret after the rotation: %v, want refused", err)
	}
	renewed := st.Subsystems[0].LastRenewal
	waitStatus(t, r, "a renewal without a rotation", func(s nodeagent.Status) bool { return s.Subsystems[0].LastRenewal.After(renewed) })
	if _, reauths := k.snapshot(); len(reauths) != 1 {
		t.Fatalf("a renewal without new credentials re-authenticated: %v", reauths)
	}

	// An agent that died (here: its gateway connection gone, so it
	// neither renews nor tears down) leaves its controller; the agent
	// that restarts takes it over with a new grant's secrets rather than
	// failing a second connect to the same port.
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("agent shutdown: %v\n%s", err, r.log)
	}
	r.done <- nil
	k.mu.Lock()
	orphan := map[string]string{}
	for a, v := range first {
		orphan[a] = v
	}
	k.ctrls = map[string]map[string]string{"nvme9": orphan}
	k.mu.Unlock()
	must("acme-scheduler", "job", "admit", "job-2", "--tenant", "acme", "--node", node1, "--namespace", sub+"/1:rw", "--region", "eu-west", "--expires-in", "2h")
	r = startNodeAgent(t, dir, "acme-node-1", "job-2", k)
	st = waitStatus(t, r, "the take-over", func(s nodeagent.Status) bool { return len(s.Subsystems) == 1 && s.Subsystems[0].Controller != "" })
	if c, reauths := k.snapshot(); st.Subsystems[0].Controller != "nvme9" || len(c) != 1 || len(reauths) != 2 || reauths[1] != nil {
		t.Fatalf("the restarted agent did not take over nvme9: status %+v, controllers %v, re-authentications %v", st.Subsystems[0], c, reauths)
	}
	s0.Grant = st.Subsystems[0].Grant

	// Shutdown: the controller goes, the grant is released, the host
	// leaves the target.
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatalf("agent shutdown: %v\n%s", err, r.log)
	}
	r.done <- nil
	if c, _ := k.snapshot(); len(c) != 0 {
		t.Fatalf("controllers left after the shutdown: %v", c)
	}
	if _, err := os.Lstat(filepath.Join(cfs, "subsystems", sub, "allowed_hosts", hostNQN)); !os.IsNotExist(err) {
		t.Fatalf("the host is still allowed on the target after the shutdown (%v)", err)
	}
	if out := must("admin", "grants", "list", "--job", "job-2", "--state", "released"); !strings.Contains(out, s0.Grant) {
		t.Fatalf("grant %s not released:\n%s", s0.Grant, out)
	}

	// The job finishes while a second run is connected: the agent's next
	// renewal is refused, it disconnects and ends by itself.
	r2 := startNodeAgent(t, dir, "acme-node-1", "job-1", k)
	waitStatus(t, r2, "the second connect", func(s nodeagent.Status) bool { return len(s.Subsystems) == 1 && s.Subsystems[0].Controller != "" })
	must("acme-scheduler", "job", "finish", "job-1", "--reason", "done")
	select {
	case err := <-r2.done:
		r2.done <- err
		if !errors.Is(err, nodeagent.ErrJobEnded) {
			t.Fatalf("the agent after the job finished: %v, want ErrJobEnded", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the agent still runs after the job finished:\n%s", r2.log)
	}
	if c, _ := k.snapshot(); len(c) != 0 {
		t.Fatalf("controllers left after the job finished: %v", c)
	}
}
