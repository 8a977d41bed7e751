package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
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
	sessions map[string]*session // by job and subsystem
	volumes  map[string]*staged  // by volume ID
	busy     map[string]bool     // volume IDs with a call in flight
}

// session is one node agent: one job's grant for one subsystem, shared by
// the volumes of its namespaces.
type session struct {
	agent  *nodeagent.Agent
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's, once done is closed
	users  map[string]bool
}

// staged is a staged volume, as its state file keeps it.
type staged struct {
	VolumeID string          `json:"volume_id"`
	Staging  string          `json:"staging_target_path"`
	Mode     string          `json:"mode"`
	Device   string          `json:"device"`
	Targets  map[string]bool `json:"targets,omitempty"`
	// Unreleased are grants whose release the gateway has not taken.
	Unreleased []string `json:"unreleased,omitempty"`
	vol        Volume
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
// fails it at once with the policy's reason.
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
	v, err := ParseHandle(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "no such volume: %v", err)
	}
	n.mu.Lock()
	st, ok := n.volumes[req.GetVolumeId()]
	n.mu.Unlock()
	if ok {
		if st.Staging != req.GetStagingTargetPath() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s", v.Handle(), st.Staging)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	st = &staged{VolumeID: req.GetVolumeId(), Staging: req.GetStagingTargetPath(), Mode: mode, vol: v}
	if err := n.stage(ctx, st); err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stage connects st's namespace and records it.
func (n *Node) stage(ctx context.Context, st *staged) error {
	v := st.vol
	s := n.join(v, st.VolumeID)
	dev, err := n.await(ctx, s, v)
	if err == nil && st.Mode == nvmegate.ModeReadOnly {
		if rerr := n.Mounter.ReadOnly(dev); rerr != nil {
			err = status.Errorf(codes.Internal, "make %s read-only: %v", dev, rerr)
		}
	}
	if err == nil {
		st.Device = dev
		err = n.save(st)
	}
	if err != nil {
		if _, lerr := n.leave(v, st.VolumeID); lerr != nil {
			n.log().Error("stage failed; and the release after it", "volume", st.VolumeID, "err", lerr)
		}
		return err
	}
	n.mu.Lock()
	if n.volumes == nil {
		n.volumes = map[string]*staged{}
	}
	n.volumes[st.VolumeID] = st
	n.mu.Unlock()
	n.log().Info("staged", "volume", st.VolumeID, "job", v.Job, "device", dev, "mode", st.Mode)
	return nil
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

func sessionKey(v Volume) string { return v.Job + "\x00" + v.NQN }

// join adds a volume to its job's session for the subsystem, starting the
// session's agent if it is the first.
func (n *Node) join(v Volume, id string) *session {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sessions == nil {
		n.sessions = map[string]*session{}
	}
	k := sessionKey(v)
	if s, ok := n.sessions[k]; ok {
		select {
		case <-s.done: // ended (the job's grants ended): start anew
		default:
			s.users[id] = true
			return s
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{cancel: cancel, done: make(chan struct{}), users: map[string]bool{id: true},
		agent: &nodeagent.Agent{Gateway: n.Gateway, Kernel: n.Kernel, Keys: n.Keys, Job: v.Job,
			Subsystems: []string{v.NQN}, TTL: n.TTL, RenewEvery: n.RenewEvery,
			Log: n.log().With("job", v.Job, "subsystem", v.NQN)}}
	n.sessions[k] = s
	go func() {
		s.err = s.agent.Run(ctx)
		close(s.done)
	}()
	return s
}

// leave takes a volume out of its session; the last one out stops the
// agent, which disconnects and releases the grant. What it could not
// release is returned with the error, for the caller to try again.
func (n *Node) leave(v Volume, id string) (unreleased []string, err error) {
	n.mu.Lock()
	k := sessionKey(v)
	s, ok := n.sessions[k]
	if ok {
		delete(s.users, id)
		if len(s.users) > 0 {
			ok = false
		} else {
			delete(n.sessions, k)
		}
	}
	n.mu.Unlock()
	if !ok {
		return nil, nil
	}
	var grants []string
	for _, ss := range s.agent.Status().Subsystems {
		if ss.Grant != "" {
			grants = append(grants, ss.Grant)
		}
	}
	s.cancel()
	<-s.done
	if s.err == nil || errors.Is(s.err, nodeagent.ErrJobEnded) || errors.Is(s.err, nodeagent.ErrNotGranted) {
		return nil, nil
	}
	return grants, s.err
}

// release retries the release of grants a stopped agent could not
// release; a grant the gateway already ended is released.
func (n *Node) release(ctx context.Context, grants []string) error {
	for _, g := range grants {
		_, err := n.Gateway.Release(ctx, &pb.ReleaseRequest{GrantId: g})
		switch status.Code(err) {
		case codes.OK, codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied:
		default:
			return fmt.Errorf("release %s: %w", g, err)
		}
	}
	return nil
}

// refusals are the gateway's answers that waiting does not change.
var refusals = map[string]codes.Code{
	codes.PermissionDenied.String():   codes.PermissionDenied,
	codes.NotFound.String():           codes.FailedPrecondition,
	codes.FailedPrecondition.String(): codes.FailedPrecondition,
	codes.InvalidArgument.String():    codes.InvalidArgument,
}

// await waits until the volume's namespace has its block device.
func (n *Node) await(ctx context.Context, s *session, v Volume) (string, error) {
	limit := n.ConnectTimeout
	if limit <= 0 {
		limit = time.Minute
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "the agent has not connected yet"
	for {
		select {
		case <-s.done:
			return "", endedErr(v, s.err)
		case <-ctx.Done():
			return "", status.Errorf(codes.DeadlineExceeded, "volume %s: %v while connecting (%s)", v.Handle(), ctx.Err(), last)
		case <-deadline.C:
			return "", status.Errorf(codes.DeadlineExceeded, "volume %s: no block device after %v (%s)", v.Handle(), limit, last)
		case <-tick.C:
		}
		for _, ss := range s.agent.Status().Subsystems {
			if ss.Subsystem != v.NQN {
				continue
			}
			if ss.Error != "" {
				if code, ok := refusals[ss.ErrorCode]; ok {
					return "", status.Errorf(code, "volume %s: nvmegate refused this node: %s", v.Handle(), ss.Error)
				}
				last = ss.Error
			}
			if ss.Controller == "" || ss.State != "live" {
				continue
			}
			dev, err := n.Kernel.Device(ss.Controller, v.NSID)
			if err != nil || dev == "" {
				last = fmt.Sprintf("controller %s is live; namespace %d has no block device yet", ss.Controller, v.NSID)
				continue
			}
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
			last = dev + " is not there yet"
		}
	}
}

// endedErr says why an agent stopped before the volume was staged.
func endedErr(v Volume, err error) error {
	switch {
	case errors.Is(err, nodeagent.ErrNotGranted):
		return status.Errorf(codes.FailedPrecondition, "volume %s is not published to this node: %v", v.Handle(), err)
	case errors.Is(err, nodeagent.ErrJobEnded):
		return status.Errorf(codes.FailedPrecondition, "volume %s: job %s's grants ended", v.Handle(), v.Job)
	case err == nil:
		return status.Errorf(codes.Aborted, "volume %s: the node agent stopped", v.Handle())
	}
	return fromGateway("volume "+v.Handle(), err)
}

// NodeUnstageVolume disconnects the volume's namespace and releases its
// grant; it fails, and the CO retries, while the gateway has not taken
// the release.
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
	unreleased, err := n.leave(st.vol, st.VolumeID)
	if err == nil {
		err = n.release(ctx, st.Unreleased)
	}
	if err != nil {
		n.mu.Lock()
		st.Unreleased = append(st.Unreleased, unreleased...)
		n.mu.Unlock()
		n.save(st)
		return nil, status.Errorf(codes.Unavailable, "volume %s: disconnected, but the gateway did not take the release (the CO retries): %v", st.vol.Handle(), err)
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
// target path.
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
	if st.Targets[req.GetTargetPath()] {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if mode == nvmegate.ModeReadWrite && st.Mode == nvmegate.ModeReadOnly {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged read-only", st.vol.Handle())
	}
	if err := n.Mounter.Publish(st.Device, req.GetTargetPath(), mode == nvmegate.ModeReadOnly); err != nil {
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

func (n *Node) statePath(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(n.StateDir, hex.EncodeToString(sum[:16])+".json")
}

// save writes st's state file (atomically: a crash leaves the old or the
// new one).
func (n *Node) save(st *staged) error {
	if n.StateDir == "" {
		return nil
	}
	n.mu.Lock()
	b, err := json.Marshal(st)
	n.mu.Unlock()
	if err == nil {
		err = os.MkdirAll(n.StateDir, 0o700)
	}
	if err == nil {
		p := n.statePath(st.VolumeID)
		err = os.WriteFile(p+".tmp", b, 0o600)
		if err == nil {
			err = os.Rename(p+".tmp", p)
		}
	}
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: state: %v", st.vol.Handle(), err)
	}
	return nil
}

// Resume takes back the volumes a previous run of the plugin staged: each
// is connected again (the agent adopts a controller that is still there),
// so that its grant is renewed. What cannot be taken back is logged and
// left for the CO's unstage.
func (n *Node) Resume(ctx context.Context) error {
	ents, err := os.ReadDir(n.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(n.StateDir, e.Name()))
		if err != nil {
			return err
		}
		st := &staged{}
		if err := json.Unmarshal(b, st); err != nil {
			n.log().Error("a state file that does not parse is left", "file", e.Name(), "err", err)
			continue
		}
		if st.vol, err = ParseHandle(st.VolumeID); err != nil {
			n.log().Error("a state file with a bad volume ID is left", "file", e.Name(), "err", err)
			continue
		}
		done, err := n.claim(st.VolumeID)
		if err != nil {
			continue // the CO is at it already
		}
		err = n.stage(ctx, st)
		done()
		if err != nil {
			n.log().Error("could not take back a staged volume", "volume", st.VolumeID, "err", err)
			continue
		}
		n.log().Info("took back a staged volume", "volume", st.VolumeID, "targets", len(st.Targets))
	}
	return nil
}
