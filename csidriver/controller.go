package csidriver

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/dataset"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Jobs is the part of the gateway's Jobs service the controller calls
// (pb.JobsClient is one).
type Jobs interface {
	Admit(ctx context.Context, in *pb.AdmitRequest, opts ...grpc.CallOption) (*pb.AdmitResponse, error)
	Get(ctx context.Context, in *pb.JobsGetRequest, opts ...grpc.CallOption) (*pb.JobsGetResponse, error)
	Finish(ctx context.Context, in *pb.FinishRequest, opts ...grpc.CallOption) (*pb.FinishResponse, error)
	UpdateNodes(ctx context.Context, in *pb.UpdateNodesRequest, opts ...grpc.CallOption) (*pb.UpdateNodesResponse, error)
}

// Inventory is the part of the Inventory service the controller reads
// (pb.InventoryClient is one).
type Inventory interface {
	dataset.Lister
	GetNamespace(ctx context.Context, in *pb.GetNamespaceRequest, opts ...grpc.CallOption) (*pb.GetNamespaceResponse, error)
}

// Parameters of CreateVolume (StorageClass parameters).
const (
	ParamDataset = "dataset" // the inventory's dataset name: required
	ParamJob     = "job"     // the training job; default: the PVC's namespace and name
	// What the external-provisioner adds with --extra-create-metadata.
	paramPVCName      = "csi.storage.k8s.io/pvc/name"
	paramPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	paramPVName       = "csi.storage.k8s.io/pv/name"
)

// Controller is the CSI Controller service. It runs as the tenant's
// scheduler: it admits a volume's job and moves nodes in and out of it.
type Controller struct {
	csi.UnimplementedControllerServer
	Jobs      Jobs
	Inventory Inventory
	// Scheduler is the controller's own SPIFFE ID: its tenant is the one
	// it admits jobs for, its trust domain the nodes'.
	Scheduler spiffeid.ID
	// Regions the job's data may be served from (the admission's
	// allowed_regions).
	Regions []string
	// Lifetime of an admission: a job's scope expires this long after the
	// first node is published. 0 is a week.
	Lifetime time.Duration
	Now      func() time.Time

	mu    sync.Mutex
	locks map[string]*jobLock // by job: one change of a job at a time
}

func (c *Controller) tenant() string { return authz.ParseCaller(c.Scheduler).Tenant }

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// lock serializes the controller's changes of one job: the attacher
// publishes a volume to many nodes at once, and each change reads the job
// first. A job's lock lives while a call holds or waits for it.
func (c *Controller) lock(job string) func() {
	c.mu.Lock()
	if c.locks == nil {
		c.locks = map[string]*jobLock{}
	}
	l, ok := c.locks[job]
	if !ok {
		l = &jobLock{}
		c.locks[job] = l
	}
	l.users++
	c.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		c.mu.Lock()
		if l.users--; l.users == 0 {
			delete(c.locks, job)
		}
		c.mu.Unlock()
	}
}

type jobLock struct {
	sync.Mutex
	users int // calls holding or waiting; guarded by Controller.mu
}

// ControllerGetCapabilities: volumes (found, not made), publish to nodes,
// and read-only publishes.
func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume finds the dataset the parameters name and answers its
// handle for the job; nothing is made on the storage, so the same
// parameters always answer the same volume.
func (c *Controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_content_source: nvmegate volumes are existing datasets; they are not made from snapshots or clones")
	}
	p := req.GetParameters()
	for k := range p {
		switch k {
		case ParamDataset, ParamJob, paramPVCName, paramPVCNamespace, paramPVName:
		default:
			return nil, status.Errorf(codes.InvalidArgument, "parameter %s is not known (known: %s, %s)", quote(k), ParamDataset, ParamJob)
		}
	}
	name := p[ParamDataset]
	if name == "" {
		return nil, status.Errorf(codes.InvalidArgument, "parameter %q is required: the inventory's name of an existing dataset", ParamDataset)
	}
	job := p[ParamJob]
	if job == "" && p[paramPVCNamespace] != "" && p[paramPVCName] != "" {
		job = p[paramPVCNamespace] + "." + p[paramPVCName]
	}
	if job == "" {
		return nil, status.Errorf(codes.InvalidArgument, "no job: set the StorageClass parameter %q, or run the external-provisioner with --extra-create-metadata (the job is then <PVC namespace>.<PVC name>)", ParamJob)
	}
	if err := nvmegate.ValidateJobID("job", job); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	nss, err := dataset.Resolve(ctx, c.Inventory, c.tenant(), []dataset.Want{{Name: name, Mode: nvmegate.ModeReadOnly}})
	if _, ok := err.(dataset.UnknownError); ok {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err != nil {
		return nil, fromGateway("find dataset "+quote(name), err)
	}
	if len(nss) != 1 {
		return nil, status.Errorf(codes.InvalidArgument, "dataset %s is on %d namespaces; a volume is one namespace: name it by a static PV's handle <nqn>/<nsid>@<job>", name, len(nss))
	}
	v := Volume{NQN: nss[0].SubsystemNqn, NSID: nss[0].Nsid, Job: job}
	if len(v.Handle()) > MaxHandle {
		return nil, status.Errorf(codes.InvalidArgument, "the volume ID %s would be %d bytes, past CSI's %d: give the volume a shorter job (parameter %q)",
			v.Handle(), len(v.Handle()), MaxHandle, ParamJob)
	}
	// The size of an existing dataset is not the claim's to choose:
	// capacity 0 is CSI's "unknown".
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: v.Handle(),
		VolumeContext: map[string]string{ParamDataset: name, ParamJob: job}}}, nil
}

// DeleteVolume deletes nothing: the dataset outlives the claim.
func (c *Controller) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities nvmegate serves
// for a namespace that exists.
func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	if _, err := c.volume(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := checkCaps(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext: req.GetVolumeContext(), VolumeCapabilities: req.GetVolumeCapabilities(), Parameters: req.GetParameters()}}, nil
}

// volume parses a handle and checks its namespace is in the inventory.
func (c *Controller) volume(ctx context.Context, id string) (Volume, error) {
	v, err := ParseHandle(id)
	if err != nil {
		return Volume{}, status.Errorf(codes.NotFound, "no such volume: %v", err)
	}
	_, err = c.Inventory.GetNamespace(ctx, &pb.GetNamespaceRequest{SubsystemNqn: v.NQN, Nsid: v.NSID})
	if err != nil {
		return Volume{}, fromGateway("volume "+quote(id), err)
	}
	return v, nil
}

// node checks a CO's node ID: a node SPIFFE ID of the controller's trust
// domain, as the node plugin's NodeGetInfo reports it.
func (c *Controller) node(id string) (spiffeid.ID, error) {
	n, err := spiffeid.FromString(id)
	if err != nil || n.TrustDomain() != c.Scheduler.TrustDomain() || authz.ParseCaller(n).Role != authz.RoleNode {
		return spiffeid.ID{}, status.Errorf(codes.NotFound, "no such node: %s is not a node SPIFFE ID of trust domain %s", quote(id), c.Scheduler.TrustDomain())
	}
	return n, nil
}

// ControllerPublishVolume lets the node into the volume's job: the first
// node admits the job (the next generation after a finished run), the
// others join it. A writer volume is one node's at a time.
func (c *Controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	mode, err := modeOf(req.GetVolumeCapability(), req.GetReadonly())
	if err != nil {
		return nil, err
	}
	v, err := c.volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	node, err := c.node(req.GetNodeId())
	if err != nil {
		return nil, err
	}
	defer c.lock(v.Job)()
	want := &pb.JobNamespace{SubsystemNqn: v.NQN, Nsid: v.NSID, Mode: pbMode(mode)}
	// Two tries: an admission that lost a race to another controller
	// reads the job again.
	for try := 0; ; try++ {
		j, err := c.job(ctx, v.Job)
		if err != nil {
			return nil, err
		}
		var gen uint32
		switch {
		case j == nil:
		case j.State != pb.JobState_JOB_STATE_ACTIVE:
			gen = j.Generation + 1
		default:
			if err := sameVolume(j, want, v); err != nil {
				return nil, err
			}
			if slices.Contains(j.Nodes, node.String()) {
				return published(j), nil
			}
			if singleNode(req.GetVolumeCapability()) && len(j.Nodes) > 0 {
				return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published %s to node %s; its access mode is one node's at a time",
					v.Handle(), modeName(j.Namespaces[0].Mode), j.Nodes[0])
			}
			resp, err := c.Jobs.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: v.Job, Generation: &j.Generation, AddNodes: []string{node.String()}})
			if err != nil {
				return nil, fromGateway("add node "+node.String()+" to job "+v.Job, err)
			}
			return published(resp.Job), nil
		}
		resp, err := c.Jobs.Admit(ctx, &pb.AdmitRequest{JobId: v.Job, Tenant: c.tenant(), Nodes: []string{node.String()},
			Namespaces: []*pb.JobNamespace{want}, AllowedRegions: c.Regions, Generation: gen,
			ExpiresAt: timestamppb.New(c.now().Add(c.lifetime()).Truncate(time.Second))})
		if status.Code(err) == codes.AlreadyExists && try == 0 {
			continue
		}
		if err != nil {
			return nil, fromGateway("admit job "+v.Job, err)
		}
		return published(resp.Job), nil
	}
}

func (c *Controller) lifetime() time.Duration {
	if c.Lifetime > 0 {
		return c.Lifetime
	}
	return 7 * 24 * time.Hour
}

// job reads a job; nil if the tenant has none of that ID. The gateway
// answers a scheduler PermissionDenied for a job that is not its
// tenant's, whether it is another tenant's or no one's, so as not to tell
// which: either way it holds nothing this controller published (an
// admission under the ID is then refused if the ID is taken).
func (c *Controller) job(ctx context.Context, id string) (*pb.Job, error) {
	resp, err := c.Jobs.Get(ctx, &pb.JobsGetRequest{JobId: id})
	if code := status.Code(err); code == codes.NotFound || code == codes.PermissionDenied {
		return nil, nil
	}
	if err != nil {
		return nil, fromGateway("read job "+id, err)
	}
	return resp.Job, nil
}

// sameVolume refuses a publish whose volume is not the active job's
// scope: another namespace, or the same one in another mode.
func sameVolume(j *pb.Job, want *pb.JobNamespace, v Volume) error {
	if !holds(j, v) {
		return status.Errorf(codes.FailedPrecondition, "job %s is active with another scope (%d namespace(s)); a job's volume is one namespace: give each volume its own job",
			v.Job, len(j.Namespaces))
	}
	if j.Namespaces[0].Mode != want.Mode {
		return status.Errorf(codes.AlreadyExists, "volume %s is published %s; this publish asks %s", v.Handle(), modeName(j.Namespaces[0].Mode), modeName(want.Mode))
	}
	return nil
}

// holds reports whether job j's scope is volume v's namespace, alone.
func holds(j *pb.Job, v Volume) bool {
	return j != nil && len(j.Namespaces) == 1 && j.Namespaces[0].SubsystemNqn == v.NQN && j.Namespaces[0].Nsid == v.NSID
}

// Keys of the publish context the node plugin reads.
const (
	ctxJob        = "job"
	ctxGeneration = "generation"
	ctxMode       = "mode" // the job's mode for the namespace: the node enforces read-only
)

func published(j *pb.Job) *csi.ControllerPublishVolumeResponse {
	mode := nvmegate.ModeReadOnly
	if len(j.GetNamespaces()) == 1 && j.Namespaces[0].Mode == pb.AccessMode_ACCESS_MODE_READ_WRITE {
		mode = nvmegate.ModeReadWrite
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		ctxJob: j.GetJobId(), ctxGeneration: strconv.FormatUint(uint64(j.GetGeneration()), 10), ctxMode: mode}}
}

func pbMode(m string) pb.AccessMode {
	if m == nvmegate.ModeReadWrite {
		return pb.AccessMode_ACCESS_MODE_READ_WRITE
	}
	return pb.AccessMode_ACCESS_MODE_READ_ONLY
}

func modeName(m pb.AccessMode) string {
	if m == pb.AccessMode_ACCESS_MODE_READ_WRITE {
		return "read-write"
	}
	return "read-only"
}

// ControllerUnpublishVolume takes the node out of the volume's job: its
// grants end and the targets drop it. The last node's leaving finishes
// the job's run. It answers OK only once the gateway says the node's
// grants ended, also on a retry; a volume it never published is
// unpublished.
func (c *Controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	v, err := ParseHandle(req.GetVolumeId())
	if err != nil {
		return &csi.ControllerUnpublishVolumeResponse{}, nil // never ours
	}
	defer c.lock(v.Job)()
	j, err := c.job(ctx, v.Job)
	if err != nil {
		return nil, err
	}
	if !holds(j, v) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil // never published, or the job holds another volume
	}
	node := req.GetNodeId()
	last := node == "" || len(j.Nodes) == 0 || len(j.Nodes) == 1 && j.Nodes[0] == node
	if j.State != pb.JobState_JOB_STATE_ACTIVE || last {
		// Finished already, the finish is asked again: it ends again any
		// grant a finish before left (one cut short, a target that had
		// not followed), so an OK is never on the word of a call that
		// failed.
		reason := fmt.Sprintf("CSI: volume %s unpublished from its last node", v.Handle())
		if _, err := c.Jobs.Finish(ctx, &pb.FinishRequest{JobId: v.Job, Generation: &j.Generation, Reason: reason}); err != nil {
			return nil, fromGateway("finish job "+v.Job, err)
		}
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	// Also for a node that is not (any more) in the job: the removal then
	// changes no node and ends any grant of its that a call before left.
	if _, err := c.Jobs.UpdateNodes(ctx, &pb.UpdateNodesRequest{JobId: v.Job, Generation: &j.Generation, RemoveNodes: []string{node}}); err != nil {
		return nil, fromGateway("remove node "+node+" from job "+v.Job, err)
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
