package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// The workloads of the SPIRE story and their SPIFFE IDs (DESIGN §3): the
// dev identities, so that the demo script runs on SPIRE unchanged.
var spireIDs = func() map[string]string {
	m := map[string]string{}
	for _, id := range devca.DevIdentities {
		m[id.Name] = "spiffe://nvmegate.test" + id.Path
	}
	return m
}()

// svidTTL is short so that SPIRE rotates every SVID during the test (the
// agent renews at half-life).
const svidTTL = 20 * time.Second

// spireStack is a SPIRE server and agent (join_token, sqlite, memory keys,
// unix workload attestor) on a temp dir.
type spireStack struct {
	bin, dir, serverSock, agentSock string
}

func startSPIRE(t *testing.T, spireDir string) *spireStack {
	t.Helper()
	dir, err := os.MkdirTemp("", "spire") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &spireStack{bin: spireDir, dir: dir, serverSock: filepath.Join(dir, "server.sock"), agentSock: filepath.Join(dir, "agent.sock")}
	port := freePort(t)
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("server.conf", fmt.Sprintf(`server {
  bind_address = "127.0.0.1"
  bind_port = "%d"
  socket_path = %q
  trust_domain = "nvmegate.test"
  data_dir = %q
  log_level = "WARN"
  ca_ttl = "24h"
  default_x509_svid_ttl = "1h"
}
plugins {
  DataStore "sql" {
    plugin_data {
      database_type = "sqlite3"
      connection_string = %q
    }
  }
  NodeAttestor "join_token" {
    plugin_data {}
  }
  KeyManager "memory" {
    plugin_data {}
  }
}
`, port, s.serverSock, filepath.Join(dir, "server-data"), filepath.Join(dir, "datastore.sqlite3")))
	write("agent.conf", fmt.Sprintf(`agent {
  data_dir = %q
  log_level = "WARN"
  server_address = "127.0.0.1"
  server_port = "%d"
  socket_path = %q
  trust_domain = "nvmegate.test"
  insecure_bootstrap = true
}
plugins {
  NodeAttestor "join_token" {
    plugin_data {}
  }
  KeyManager "memory" {
    plugin_data {}
  }
  WorkloadAttestor "unix" {
    plugin_data {}
  }
}
`, filepath.Join(dir, "agent-data"), port, s.agentSock))
	s.daemon(t, "spire-server", "run", "-config", filepath.Join(dir, "server.conf"))
	s.waitHealthy(t, "spire-server", s.serverSock)
	out := s.run(t, "spire-server", "token", "generate", "-socketPath", s.serverSock, "-spiffeID", "spiffe://nvmegate.test/agent/e2e")
	token := strings.TrimSpace(strings.TrimPrefix(out, "Token:"))
	s.daemon(t, "spire-agent", "run", "-config", filepath.Join(dir, "agent.conf"), "-joinToken", token)
	s.waitHealthy(t, "spire-agent", s.agentSock)
	return s
}

func (s *spireStack) daemon(t *testing.T, name string, args ...string) {
	t.Helper()
	log, err := os.Create(filepath.Join(s.dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = s.dir, log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
}

func (s *spireStack) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(s.bin, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func (s *spireStack) waitHealthy(t *testing.T, name, sock string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if exec.Command(filepath.Join(s.bin, name), "healthcheck", "-socketPath", sock).Run() == nil {
			return
		}
	}
	log, _ := os.ReadFile(filepath.Join(s.dir, name+".log"))
	t.Fatalf("%s not healthy in 60 s:\n%s", name, log)
}

// serials fetches, through the Workload API as this process, the serial
// of every SVID the agent gives it, by SPIFFE ID.
func (s *spireStack) serials(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, err := workloadapi.FetchX509Context(ctx, workloadapi.WithAddr("unix://"+s.agentSock))
	if err != nil {
		t.Logf("workload API: %v", err) // "no identity issued" until the agent syncs the entries
		return map[string]string{}
	}
	out := map[string]string{}
	for _, svid := range x.SVIDs {
		out[svid.ID.String()] = svid.Certificates[0].SerialNumber.String()
	}
	return out
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The story against real processes with real SPIRE SVIDs: a SPIRE server
// and agent issue every workload's SVID (all registered for this test's uid,
// each client picking its own by ID); the gateway, a remote target agent
// and the CLI run on them; SPIRE rotates every SVID during the test without
// a failed call; and nothing secret reaches the logs, the metrics or the
// audit log.
func TestSPIRE(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: builds and runs the binaries")
	}
	spireDir := builtByMake(t, "NVMEGATE_SPIRE", "SPIRE with scripts/build-spire.sh")
	bin := buildBinaries(t)
	sp := startSPIRE(t, spireDir)
	for _, id := range spireIDs {
		sp.run(t, "spire-server", "entry", "create", "-socketPath", sp.serverSock, "-parentID", "spiffe://nvmegate.test/agent/e2e",
			"-spiffeID", id, "-selector", fmt.Sprintf("unix:uid:%d", os.Getuid()), "-x509SVIDTTL", fmt.Sprint(int(svidTTL.Seconds())))
	}
	// The agent learns new entries at its next sync (every 5 s).
	var first map[string]string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if first = sp.serials(t); len(first) == len(spireIDs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent offers %d of %d SVIDs after 60 s", len(first), len(spireIDs))
		}
	}

	work := t.TempDir()
	socket := "unix://" + sp.agentSock
	ready := filepath.Join(work, "ready.json")
	gwLog := filepath.Join(work, "gateway.log")
	gw := startProcess(t, gwLog, filepath.Join(bin, "nvmegated"), "--spiffe-socket", socket, "--spiffe-id", spireIDs["gateway"],
		"--trust-domain", "nvmegate.test", "--state-dir", filepath.Join(work, "state"), "--listen", "127.0.0.1:0",
		"--http-listen", "127.0.0.1:0", "--ready-file", ready, "--remote-targets", "stor-eu-1")
	var info struct{ GRPC, HTTP string }
	waitJSON(t, ready, &info, gwLog)
	as := func(who string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "nvmegate"), append([]string{"--spiffe-socket", socket, "--spiffe-id", spireIDs[who], "--addr", info.GRPC}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(who string, args ...string) string {
		t.Helper()
		out, err := as(who, args...)
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", who, args, err, out)
		}
		return out
	}
	const sub = "nqn.2026-01.io.nvmegate.spire:acme-train"
	nqn, err := nvmefmt.HostNQNFromSPIFFEID(spireIDs["acme-node-1"])
	if err != nil {
		t.Fatal(err)
	}
	must("admin", "inventory", "target", "add", "stor-eu-1", "--fabric", "fab-eu", "--region", "eu-west", "--driver", "nvmet",
		"--port", "id=1,transport=tcp,family=ipv4,address=127.0.0.1,service=4420")
	must("admin", "inventory", "subsystem", "add", sub, "--target", "stor-eu-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	must("admin", "inventory", "namespace", "add", sub, "1", "--tenant", "acme", "--region", "eu-west", "--class", "internal",
		"--dataset", "spire/ds", "--digest", "sha256:"+strings.Repeat("ab", 32))
	must("admin", "inventory", "host", "add", spireIDs["acme-node-1"], "--nqn", nqn, "--tenant", "acme")
	if out, err := as("acme-node-1", "inventory", "target", "add", "rogue", "--fabric", "f", "--region", "eu-west",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.1,service=4420"); err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Fatalf("a node changed the inventory: %v\n%s", err, out)
	}

	// stor-eu-1's own agent, with the target's SPIRE SVID.
	nvmetRoot := filepath.Join(work, "nvmet")
	agentLog := filepath.Join(work, "target-agent.log")
	startProcess(t, agentLog, filepath.Join(bin, "nvmegate-target"), "--spiffe-socket", socket, "--spiffe-id", spireIDs["target-stor-eu-1"],
		"--addr", info.GRPC, "--nvmet-root", nvmetRoot)
	waitLog(t, agentLog, "applied")

	must("acme-scheduler", "job", "admit", "spire-1", "--tenant", "acme", "--node", spireIDs["acme-node-1"],
		"--namespace", sub+"/1:ro", "--region", "eu-west", "--expires-in", "2h")
	cfg := filepath.Join(work, "node1-config.json")
	must("acme-node-1", "connect", "--job", "spire-1", "--subsystem", sub, "--write-config", cfg)
	hosts, _ := os.ReadDir(filepath.Join(nvmetRoot, "subsystems", sub, "allowed_hosts"))
	if len(hosts) != 1 || hosts[0].Name() != nqn {
		t.Fatalf("the remote agent's tree allows %v, want [%s]", hosts, nqn)
	}
	if out, err := as("globex-node-1", "connect", "--job", "spire-1", "--subsystem", sub); err == nil || !strings.Contains(out, "PermissionDenied") {
		t.Fatalf("globex's node connected to acme's job: %v\n%s", err, out)
	}

	// Keep calling until SPIRE has rotated the gateway's, the target
	// agent's and the node's SVIDs: every call must succeed.
	calls := 0
	for deadline := time.Now().Add(3 * svidTTL); ; time.Sleep(time.Second) {
		must("admin", "inventory", "target", "list")
		calls++
		now := sp.serials(t)
		if now[spireIDs["gateway"]] != first[spireIDs["gateway"]] && now[spireIDs["target-stor-eu-1"]] != first[spireIDs["target-stor-eu-1"]] &&
			now[spireIDs["acme-node-1"]] != first[spireIDs["acme-node-1"]] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SPIRE did not rotate the SVIDs in %s", 3*svidTTL)
		}
	}
	t.Logf("SVIDs rotated; %d calls across the rotation, none failed", calls)
	// After the rotation: a node connects again (new handshakes with the
	// rotated SVIDs, the target agent's stream carried on).
	must("acme-node-1", "connect", "--job", "spire-1", "--subsystem", sub)
	must("acme-scheduler", "job", "finish", "spire-1", "--reason", "done")
	if hosts, _ := os.ReadDir(filepath.Join(nvmetRoot, "subsystems", sub, "allowed_hosts")); len(hosts) != 0 {
		t.Fatalf("hosts left after the job finished: %v", hosts)
	}

	// The CSI driver's plugins on SPIRE's SVIDs from the Workload API: the
	// controller as acme's scheduler, the node plugin as the node, whose
	// SPIFFE ID is its CSI node ID; a publish admits that node. (Staging
	// needs the kernel: the VM tier.)
	spiffe := func(who string) []string {
		return []string{"--spiffe-socket", socket, "--spiffe-id", spireIDs[who], "--addr", info.GRPC}
	}
	ctrl := startCSI(t, bin, "controller", append(spiffe("acme-scheduler"), "--region", "eu-west")...)
	csiNode := startCSI(t, bin, "node", append(spiffe("acme-node-1"), "--state-dir", filepath.Join(work, "csi-state"), "--path-root", work)...)
	cctx := context.Background()
	ni, err := csi.NewNodeClient(csiNode.conn).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.NodeId != spireIDs["acme-node-1"] {
		t.Fatalf("the node plugin's node ID: %v, %v; want its SVID's %s", ni, err, spireIDs["acme-node-1"])
	}
	rox := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY}}
	cc := csi.NewControllerClient(ctrl.conn)
	vol, err := cc.CreateVolume(cctx, &csi.CreateVolumeRequest{Name: "pvc-spire", VolumeCapabilities: []*csi.VolumeCapability{rox},
		Parameters: map[string]string{"dataset": "spire/ds", "job": "spire-csi-1"}})
	if err != nil {
		t.Fatalf("CreateVolume on SPIRE: %v", err)
	}
	if _, err := cc.ControllerPublishVolume(cctx, &csi.ControllerPublishVolumeRequest{VolumeId: vol.Volume.VolumeId, NodeId: ni.NodeId,
		VolumeCapability: rox, Readonly: true}); err != nil {
		t.Fatalf("ControllerPublishVolume on SPIRE: %v", err)
	}
	if out := must("acme-scheduler", "-o", "json", "job", "get", "spire-csi-1"); !strings.Contains(out, spireIDs["acme-node-1"]) {
		t.Fatalf("the CSI publish did not admit the node:\n%s", out)
	}
	if _, err := cc.ControllerUnpublishVolume(cctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol.Volume.VolumeId, NodeId: ni.NodeId}); err != nil {
		t.Fatalf("ControllerUnpublishVolume on SPIRE: %v", err)
	}
	t.Logf("nvmegate-csi on SPIRE: node ID %s, volume %s published and unpublished", ni.NodeId, vol.Volume.VolumeId)

	// The whole demo script, on SPIRE's SVIDs: its own gateway and target
	// agent, every CLI call picking its identity's SVID.
	demo := filepath.Join(work, "demo")
	var ids []string
	for name, id := range spireIDs {
		ids = append(ids, name+"="+id)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer dcancel()
	script := exec.CommandContext(dctx, "bash", filepath.Join(repoRoot(t), "scripts", "demo.sh"))
	script.Env = append(os.Environ(), "BIN="+bin, "DEMO_DIR="+demo, "SPIFFE_SOCKET="+socket, "SPIFFE_IDS="+strings.Join(ids, " "))
	script.WaitDelay = 10 * time.Second
	out, err := script.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Demo passed") || !strings.Contains(string(out), "SVIDs from the SPIFFE Workload API") {
		t.Fatalf("the demo on SPIRE: %v\n%s", err, out)
	}
	t.Logf("the demo on SPIRE: %s", strings.TrimSpace(string(out[bytes.LastIndex(out, []byte("Demo passed")):])))
	configs, _ := filepath.Glob(filepath.Join(demo, "node*-config.json"))
	for _, c := range configs {
		data, _ := os.ReadFile(c)
		keepSecrets(t.Name()+": demo "+filepath.Base(c), data)
	}
	scanFiles(t, filepath.Join(demo, "gateway.log"), filepath.Join(demo, "target-agent.log"), filepath.Join(demo, "state", "audit.db"),
		filepath.Join(demo, "audit-export"))
	scanQuoted(t.Name()+": demo output", out)

	// The auditor exports the log; it verifies offline.
	export := filepath.Join(work, "export")
	must("auditor", "audit", "export", "--out", export)
	if out, err := exec.Command(filepath.Join(bin, "nvmegate"), "audit", "verify", export, "--key", filepath.Join(export, "keys", "v1.pem")).CombinedOutput(); err != nil {
		t.Fatalf("audit verify: %v\n%s", err, out)
	}

	// No secret anywhere but the node's own config file.
	resp, err := http.Get("http://" + info.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte("nvmegate_")) {
		t.Fatalf("no nvmegate metrics:\n%.2000s", metrics)
	}
	gw.stop(t)
	// The node's config is the only place its secrets may be: the scan
	// after the run looks for them here and in every other test's files.
	data, _ := os.ReadFile(cfg)
	if keepSecrets(t.Name()+": the node's config", data) == 0 {
		t.Fatal("the node's config has no secret: the secret scan would prove nothing")
	}
	scanBytes(t.Name()+": metrics", metrics)
	scanFiles(t, gwLog, agentLog, export, filepath.Join(work, "state", "audit.db"))
}

type process struct{ cmd *exec.Cmd }

func startProcess(t testing.TB, logPath, name string, args ...string) *process {
	t.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		log.Close()
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(os.Interrupt)
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("%s exited with %v", filepath.Base(p.cmd.Path), err)
	}
}

func waitJSON(t *testing.T, path string, v any, logPath string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if data, err := os.ReadFile(path); err == nil && jsonUnmarshal(data, v) == nil {
			return
		}
	}
	log, _ := os.ReadFile(logPath)
	t.Fatalf("%s did not appear in 60 s:\n%s", path, log)
}

func waitLog(t *testing.T, path, want string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if data, _ := os.ReadFile(path); bytes.Contains(data, []byte(want)) {
			return
		}
	}
	log, _ := os.ReadFile(path)
	t.Fatalf("%q not in %s after 60 s:\n%s", want, path, log)
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
