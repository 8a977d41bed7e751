package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// csiPlugin is one nvmegate-csi process serving on a unix socket.
type csiPlugin struct {
	sock string
	log  string
	conn *grpc.ClientConn
}

// startCSI runs nvmegate-csi MODE with args (its identity flags among
// them) and waits for its socket to answer Probe.
func startCSI(t *testing.T, bin, mode string, args ...string) *csiPlugin {
	t.Helper()
	dir := t.TempDir()
	p := &csiPlugin{sock: filepath.Join(dir, mode+".sock"), log: filepath.Join(dir, mode+".log")}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(filepath.Join(bin, "nvmegate-csi"), append([]string{mode, "--endpoint", "unix://" + p.sock}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	scanFiles(t, p.log)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p.conn, err = grpc.NewClient("unix://"+p.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := csi.NewIdentityClient(p.conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(p.log)
			t.Fatalf("nvmegate-csi %s did not answer Probe: %v\n%s", mode, err, b)
		}
	}
}

// csiInventory is the inventory the CSI tests run on: acme's dataset and
// its immutable archive on stor-eu-1, globex's checkpoints.
func csiInventory(t *testing.T, bin, dev string) {
	t.Helper()
	admin := func(args ...string) {
		t.Helper()
		if out, err := cli(t, bin, dev, "admin", args...); err != nil {
			t.Fatalf("nvmegate %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	admin("inventory", "target", "add", "stor-eu-1", "--fabric", "fab-eu", "--region", "eu-west", "--driver", "nvmet",
		"--port", "id=1,transport=tcp,family=ipv4,address=10.0.0.10,service=4420,secure=none")
	admin("inventory", "subsystem", "add", "nqn.2026-01.io.example:acme-train", "--target", "stor-eu-1", "--tenant", "acme", "--ports", "1", "--dhchap")
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:acme-train", "1", "--tenant", "acme", "--region", "eu-west",
		"--class", "internal", "--dataset", "common-crawl/2026-10", "--digest", digest)
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:acme-train", "2", "--tenant", "acme", "--region", "eu-west",
		"--class", "immutable", "--dataset", "acme/archive", "--digest", digest)
	admin("inventory", "subsystem", "add", "nqn.2026-01.io.example:globex-ckpt", "--target", "stor-eu-1", "--tenant", "globex", "--ports", "1", "--dhchap")
	admin("inventory", "namespace", "add", "nqn.2026-01.io.example:globex-ckpt", "1", "--tenant", "globex", "--region", "eu-west",
		"--class", "internal", "--dataset", "globex/checkpoints", "--digest", digest)
}

// csiSanity runs the CSI project's csi-sanity against the two plugins and
// returns its summary line ("Ran N of M Specs …").
func csiSanity(t *testing.T, sanity, dir string, ctrl, node *csiPlugin, params map[string]string, skip string) string {
	t.Helper()
	var y strings.Builder
	for k, v := range params {
		fmt.Fprintf(&y, "%s: %q\n", k, v)
	}
	pf := filepath.Join(dir, "params.yaml")
	os.WriteFile(pf, []byte(y.String()), 0o600)
	args := []string{"--csi.endpoint", node.sock, "--csi.controllerendpoint", ctrl.sock,
		"--csi.stagingdir", filepath.Join(dir, "staging"), "--csi.mountdir", filepath.Join(dir, "mount"),
		"--csi.testvolumeaccesstype", "block", "--csi.testvolumeparameters", pf, "--ginkgo.no-color"}
	if skip != "" {
		args = append(args, "--ginkgo.skip", skip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, sanity, args...).CombinedOutput()
	summary := regexp.MustCompile(`Ran \d+ of \d+ Specs[^\n]*\n[^\n]*`).FindString(string(out))
	if err != nil || !strings.Contains(summary, "SUCCESS!") {
		cl, _ := os.ReadFile(ctrl.log)
		nl, _ := os.ReadFile(node.log)
		t.Fatalf("csi-sanity: %v\n%s\ncontroller log:\n%s\nnode log:\n%s", err, out, cl, nl)
	}
	return summary
}

// The driver against the CSI project's own tests, on the host: every
// Identity and Controller test, and the Node tests that stage nothing
// (staging needs the kernel's NVMe/TCP: the VM tier runs the whole suite,
// e2e/vm/story.sh). Then the refusals, as another tenant and as a writer
// of an immutable dataset, with the policy's reason and CSI's codes.
func TestCSIDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("e2e: runs the binaries and csi-sanity")
	}
	sanity := builtByMake(t, "NVMEGATE_CSI_SANITY", "csi-sanity")
	bin := buildBinaries(t)
	dev := t.TempDir()
	startGateway(t, bin, dev)
	csiInventory(t, bin, dev)
	ctrl := startCSI(t, bin, "controller", "--dev-dir", dev, "--dev-identity", "acme-scheduler", "--region", "eu-west")
	// The kubelet's tree: the only one the node plugin bind-mounts into.
	kubelet := t.TempDir()
	node := startCSI(t, bin, "node", "--dev-dir", dev, "--dev-identity", "acme-node-1", "--state-dir", filepath.Join(t.TempDir(), "state"), "--path-root", kubelet)

	summary := csiSanity(t, sanity, kubelet, ctrl, node, map[string]string{"dataset": "common-crawl/2026-10", "job": "csi-sanity-1"},
		`Node Service should work|Node Service should be idempotent|should remove target path`)
	t.Logf("csi-sanity (host, staging tests left to the VM tier):\n%s", summary)

	cc := csi.NewControllerClient(ctrl.conn)
	ctx := context.Background()
	block := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
	}
	rox := block(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)
	rwo := block(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	wantCode := func(what string, err error, code codes.Code, msg string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
			t.Fatalf("%s: %v; want %s with %q", what, err, code, msg)
		}
		t.Logf("%s: %s: %s", what, code, status.Convert(err).Message())
	}
	n1, n2 := "spiffe://nvmegate.test/node/acme-gpu-1", "spiffe://nvmegate.test/node/acme-gpu-2"

	// A PVC of the dataset, the job from the claim (--extra-create-metadata).
	vol, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csi.VolumeCapability{rox},
		Parameters: map[string]string{"dataset": "common-crawl/2026-10",
			"csi.storage.k8s.io/pvc/namespace": "team-a", "csi.storage.k8s.io/pvc/name": "train-7"}})
	if err != nil || vol.Volume.VolumeId != "nqn.2026-01.io.example:acme-train/1@team-a.train-7" {
		t.Fatalf("CreateVolume: %v, %v", vol, err)
	}
	id := vol.Volume.VolumeId
	// Two pods' nodes of one job: admitted, then joined.
	for _, n := range []string{n1, n2, n1} {
		if _, err := cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n, VolumeCapability: rox, Readonly: true}); err != nil {
			t.Fatalf("ControllerPublishVolume(%s): %v", n, err)
		}
	}
	// getJob is the job as the gateway has it (protojson's spacing varies:
	// parse, don't match).
	type gwJob struct {
		Nodes      []string `json:"nodes"`
		State      string   `json:"state"`
		Generation int      `json:"generation"`
	}
	getJob := func(id string) gwJob {
		t.Helper()
		out, err := cli(t, bin, dev, "admin", "-o", "json", "job", "get", id)
		var resp struct{ Job gwJob }
		if err == nil {
			err = json.Unmarshal([]byte(out), &resp)
		}
		if err != nil {
			t.Fatalf("job get %s: %v\n%s", id, err, out)
		}
		return resp.Job
	}
	if j := getJob("team-a.train-7"); j.State != "JOB_STATE_ACTIVE" || len(j.Nodes) != 2 || !slices.Contains(j.Nodes, n1) || !slices.Contains(j.Nodes, n2) {
		t.Fatalf("the job after two publishes: %+v", j)
	}
	// A writer of the same volume while readers hold it: the mode differs.
	_, err = cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n1, VolumeCapability: rwo})
	wantCode("a writer publish of a volume published read-only", err, codes.AlreadyExists, "is published read-only")
	// Unpublish both: the job's run is finished with the last.
	for _, n := range []string{n2, n1, n1} {
		if _, err := cc.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: n}); err != nil {
			t.Fatalf("ControllerUnpublishVolume(%s): %v", n, err)
		}
	}
	if j := getJob("team-a.train-7"); j.State != "JOB_STATE_FINISHED" {
		t.Fatalf("the job after the last unpublish: %+v", j)
	}
	// Published again: the next generation.
	if _, err := cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n2, VolumeCapability: rox}); err != nil {
		t.Fatalf("publish after the finish: %v", err)
	}
	if j := getJob("team-a.train-7"); j.State != "JOB_STATE_ACTIVE" || j.Generation != 1 || len(j.Nodes) != 1 || j.Nodes[0] != n2 {
		t.Fatalf("a publish after the finish: %+v; want generation 1 with node 2", j)
	}
	// A writer volume is one node's.
	w := "nqn.2026-01.io.example:acme-train/1@ckpt-9"
	if _, err := cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: w, NodeId: n1, VolumeCapability: rwo}); err != nil {
		t.Fatalf("writer publish: %v", err)
	}
	_, err = cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: w, NodeId: n2, VolumeCapability: rwo})
	wantCode("a writer volume to a second node", err, codes.FailedPrecondition, "is published read-write to node "+n1)

	// Refusals.
	_, err = cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "nqn.2026-01.io.example:acme-train/2@archive-1", NodeId: n1, VolumeCapability: rwo})
	wantCode("a writer of the immutable archive", err, codes.PermissionDenied, "mode rw is not allowed")
	_, err = cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "nqn.2026-01.io.example:globex-ckpt/1@steal-1", NodeId: n1, VolumeCapability: rox})
	wantCode("acme's scheduler publishing globex's checkpoints", err, codes.PermissionDenied, "")
	_, err = cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-x", VolumeCapabilities: []*csi.VolumeCapability{rox},
		Parameters: map[string]string{"dataset": "globex/checkpoints", "job": "steal-2"}})
	wantCode("acme's StorageClass naming globex's dataset", err, codes.InvalidArgument, "not in tenant acme's inventory")
	_, err = cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "spiffe://nvmegate.test/tenant/acme/scheduler/x", VolumeCapability: rox})
	wantCode("a node ID that is not a node", err, codes.NotFound, "not a node SPIFFE ID")
	_, err = cc.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-m", VolumeCapabilities: []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: rox.AccessMode}},
		Parameters: map[string]string{"dataset": "common-crawl/2026-10", "job": "fs-1"}})
	wantCode("a file-system volume", err, codes.InvalidArgument, "use volumeMode: Block")

	// The node side: node 1 staging a volume published to node 2 only is
	// refused by the gateway, with its reason; a pod path outside the
	// kubelet's tree is refused before anything is mounted.
	nc := csi.NewNodeClient(node.conn)
	only2 := "nqn.2026-01.io.example:acme-train/1@only-node-2"
	if _, err := cc.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: only2, NodeId: n2, VolumeCapability: rox}); err != nil {
		t.Fatalf("publish to node 2: %v", err)
	}
	_, err = nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: only2, StagingTargetPath: filepath.Join(kubelet, "staging-x"), VolumeCapability: rox})
	wantCode("node 1 staging a volume published to node 2", err, codes.PermissionDenied, "is not in the scope of job only-node-2")
	_, err = nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: only2, StagingTargetPath: "/etc/nvmegate-x", VolumeCapability: rox})
	wantCode("a staging path outside the kubelet's tree", err, codes.InvalidArgument, "is outside "+kubelet)
	_, err = nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: only2, StagingTargetPath: filepath.Join(kubelet, "staging-x"),
		TargetPath: kubelet + "/../../etc/shadow", VolumeCapability: rox})
	wantCode("a pod path that climbs out of the kubelet's tree", err, codes.InvalidArgument, "is not an absolute, clean path")
	if fi, err := os.Stat(node.sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the node plugin's socket: %v, mode %v; want 0600 (it bind-mounts devices as root)", err, fi.Mode().Perm())
	}

	// The audit log names the job and the refusal's reason.
	out, err := cli(t, bin, dev, "auditor", "audit", "query", "--job", "team-a.train-7")
	if err != nil || !strings.Contains(out, "jobs.admit team-a.train-7 generation 1") || !strings.Contains(out, "jobs.finish team-a.train-7") {
		t.Fatalf("the audit log of the CSI job: %v\n%s", err, out)
	}
}
