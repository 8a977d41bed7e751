package csidriver

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/nodeagent"
)

// Kernel is the node's NVMe-oF stack as the node service uses it
// (nvmehost.Host is one).
type Kernel interface {
	nodeagent.Kernel
	Device(controller string, nsid uint32) (string, error)
}

// Mounter puts a block device at a pod's path and takes it away
// (HostMounter does, with the kernel's bind mounts).
type Mounter interface {
	// Publish makes target (a file it creates) the device; readonly
	// where it can.
	Publish(device, target string, readonly bool) error
	// Unpublish undoes Publish; a target that is not there is done.
	Unpublish(target string) error
	// ReadOnly makes the block device refuse writes on this node.
	ReadOnly(device string) error
}

// Node is the CSI Node service. It runs on a GPU node as the node's
// SPIFFE identity and connects each staged volume's namespace with the
// node's own grant.
type Node struct {
	csi.UnimplementedNodeServer
	// NodeID is the node's SPIFFE ID, the CO's name for the node.
	NodeID  string
	Gateway nodeagent.Gateway
	Kernel  Kernel
	Keys    nodeagent.Keys // nil: grants that require TLS fail
	Mounter Mounter
	// PathRoot, when set, is the only tree staging and target paths may
	// name (the kubelet's directory): the plugin bind-mounts block devices
	// as root, so a path outside it is refused rather than trusted.
	PathRoot string
	// StateDir keeps what is staged, so that a restarted plugin takes
	// its volumes back (their grants would otherwise lapse).
	StateDir string
	// ConnectTimeout bounds a stage's wait for the block device; 0 is a
	// minute.
	ConnectTimeout time.Duration
	RenewEvery     time.Duration // the agents'; 0 is theirs
	TTL            time.Duration // asked for each grant; 0 is the gateway's
	Log            *slog.Logger

	mu       sync.Mutex
	sessions map[string]*session // by subsystem NQN: one job's at a time on a node
	volumes  map[string]*staged  // by volume ID
	busy     map[string]bool     // volume IDs with a call in flight
}

// staged is a staged volume, as its state file keeps it.
type staged struct {
	VolumeID string          `json:"volume_id"`
	Staging  string          `json:"staging_target_path"`
	Mode     string          `json:"mode"`
	Device   string          `json:"device"`
	Targets  map[string]bool `json:"targets,omitempty"`
	// What the agent connected and held, to undo it when the agent is
	// gone (a failed release, a restart whose resume failed).
	HostNQN    string   `json:"host_nqn,omitempty"`
	Controller string   `json:"controller,omitempty"`
	Grants     []string `json:"grants,omitempty"`
	vol        Volume
	s          *session // the live agent; nil once it is gone
}

func (n *Node) log() *slog.Logger {
	if n.Log != nil {
		return n.Log
	}
	return slog.New(slog.DiscardHandler)
}

// NodeGetInfo names the node by its SPIFFE ID, which the controller
// admits into jobs.
func (n *Node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.NodeID}, nil
}

// NodeGetCapabilities: volumes are staged (connected) once per node and
// published into each pod.
func (n *Node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}}}}}, nil
}

// begin checks what every node call names, a volume and a path in the
// kubelet's tree, and claims the volume; done releases it.
func (n *Node) begin(id, field, path string) (done func(), err error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if path == "" {
		return nil, status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	if err := n.checkPath(field, path); err != nil {
		return nil, err
	}
	return n.claim(id)
}

// claim marks a volume busy; a second call for it while the first runs
// is Aborted, as CSI asks.
func (n *Node) claim(id string) (func(), error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy == nil {
		n.busy = map[string]bool{}
	}
	if n.busy[id] {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is in progress", quote(id))
	}
	n.busy[id] = true
	return func() {
		n.mu.Lock()
		delete(n.busy, id)
		n.mu.Unlock()
	}, nil
}

// NodeStageVolume connects the volume's namespace with this node's grant
// and returns once its block device is there. A refusal of the gateway
// fails it at once with the policy's reason. A volume staged already is
// staged again if its agent is gone (its grants ended).
func (n *Node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	done, err := n.begin(req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer done()
	mode, err := modeOf(req.GetVolumeCapability(), false)
	if err != nil {
		return nil, err
	}
	// The job's own mode, from its admission: a read-only job's device
	// is read-only here whatever the pod's capability says.
	if req.GetPublishContext()[ctxMode] == nvmegate.ModeReadOnly {
		mode = nvmegate.ModeReadOnly
	}
	v, err := ParseHandle(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "no such volume: %v", err)
	}
	n.mu.Lock()
	st, ok := n.volumes[req.GetVolumeId()]
	live := ok && st.s != nil
	n.mu.Unlock()
	switch {
	case ok && st.Staging != req.GetStagingTargetPath():
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s", v.Handle(), st.Staging)
	case live:
		return &csi.NodeStageVolumeResponse{}, nil
	case !ok:
		st = &staged{VolumeID: req.GetVolumeId(), Staging: req.GetStagingTargetPath(), Mode: mode, vol: v}
	}
	if err := n.stage(ctx, st); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// checkPath refuses a path that is not absolute and clean, or lies
// outside PathRoot.
func (n *Node) checkPath(field, p string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return status.Errorf(codes.InvalidArgument, "%s %s is not an absolute, clean path", field, quote(p))
	}
	if n.PathRoot != "" && p != n.PathRoot && !strings.HasPrefix(p, strings.TrimSuffix(n.PathRoot, "/")+"/") {
		return status.Errorf(codes.InvalidArgument, "%s %s is outside %s", field, quote(p), n.PathRoot)
	}
	return nil
}

// NodeUnstageVolume disconnects the volume's namespace and releases its
// grant; it fails, and the CO retries, while the gateway has not taken
// the release or the controller is still there.
func (n *Node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	done, err := n.begin(req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	defer done()
	n.mu.Lock()
	st, ok := n.volumes[req.GetVolumeId()]
	n.mu.Unlock()
	if !ok {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := n.leave(ctx, st); err != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %s: not all undone (the CO retries): %v", st.vol.Handle(), err)
	}
	if err := os.Remove(n.statePath(st.VolumeID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", st.vol.Handle(), err)
	}
	n.mu.Lock()
	delete(n.volumes, st.VolumeID)
	n.mu.Unlock()
	n.log().Info("unstaged", "volume", st.VolumeID, "job", st.vol.Job)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume puts the staged volume's block device at the pod's
// target path: the device of its live controller now (a reconnect makes
// a new one), never a recorded name the kernel may have given to
// another namespace since.
func (n *Node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	done, err := n.begin(req.GetVolumeId(), "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	defer done()
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required: the volume is staged first")
	}
	mode, err := modeOf(req.GetVolumeCapability(), req.GetReadonly())
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	st, ok := n.volumes[req.GetVolumeId()]
	n.mu.Unlock()
	if !ok || st.Staging != req.GetStagingTargetPath() {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", quote(req.GetVolumeId()), quote(req.GetStagingTargetPath()))
	}
	if mode == nvmegate.ModeReadWrite && st.Mode == nvmegate.ModeReadOnly {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged read-only", st.vol.Handle())
	}
	dev, err := n.device(st)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	published := st.Targets[req.GetTargetPath()]
	n.mu.Unlock()
	if published {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := n.Mounter.Publish(dev, req.GetTargetPath(), mode == nvmegate.ModeReadOnly); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", st.vol.Handle(), err)
	}
	n.mu.Lock()
	if st.Targets == nil {
		st.Targets = map[string]bool{}
	}
	st.Targets[req.GetTargetPath()] = true
	n.mu.Unlock()
	if err := n.save(st); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume takes the device away from the pod's path and
// removes the path.
func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	done, err := n.begin(req.GetVolumeId(), "target_path", req.GetTargetPath())
	if err != nil {
		return nil, err
	}
	defer done()
	if err := n.Mounter.Unpublish(req.GetTargetPath()); err != nil {
		return nil, status.Errorf(codes.Internal, "unpublish %s: %v", quote(req.GetTargetPath()), err)
	}
	n.mu.Lock()
	st, ok := n.volumes[req.GetVolumeId()]
	if ok {
		delete(st.Targets, req.GetTargetPath())
	}
	n.mu.Unlock()
	if ok {
		if err := n.save(st); err != nil {
			return nil, err
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}
