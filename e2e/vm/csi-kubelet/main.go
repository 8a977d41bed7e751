// Command csi-kubelet makes the CSI calls Kubernetes makes for a pod's
// volume, in their order, for the VM tier's story: the external-attacher's
// ControllerPublishVolume, then the kubelet's NodeStageVolume and
// NodePublishVolume; and back. It prints each call and its outcome: the
// story's judge reads them.
//
//	csi-kubelet create --controller SOCK --name pvc-1 --mode rox --param dataset=vm/acme --param job=j1
//	csi-kubelet attach --controller SOCK --node SOCK --volume ID --mode rox --pod pod-1 --root DIR
//	csi-kubelet detach --controller SOCK --node SOCK --volume ID --pod pod-1 --root DIR
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

type params []string

func (p *params) String() string     { return strings.Join(*p, ",") }
func (p *params) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: csi-kubelet create|attach|detach [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	ctrlSock := fs.String("controller", "", "the controller plugin's socket")
	nodeSock := fs.String("node", "", "the node plugin's socket")
	volume := fs.String("volume", "", "the volume ID")
	mode := fs.String("mode", "rox", "rox (ReadOnlyMany) or rwo (ReadWriteOnce)")
	pod := fs.String("pod", "", "the pod's name")
	root := fs.String("root", "/tmp/kubelet", "the kubelet's directory")
	name := fs.String("name", "", "the claim's name (create)")
	var ps params
	fs.Var(&ps, "param", "a StorageClass parameter k=v (create; repeat)")
	fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k := &kubelet{ctx: ctx, cap: capability(*mode), readonly: *mode == "rox"}
	k.ctrl = dial(*ctrlSock)
	var err error
	switch os.Args[1] {
	case "create":
		err = k.create(*name, ps)
	case "attach":
		k.node = dial(*nodeSock)
		err = k.attach(*volume, *pod, *root)
	case "detach":
		k.node = dial(*nodeSock)
		err = k.detach(*volume, *pod, *root)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
}

func dial(sock string) *grpc.ClientConn {
	if sock == "" {
		return nil
	}
	c, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	return c
}

func capability(mode string) *csi.VolumeCapability {
	m := csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	if mode == "rwo" {
		m = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	}
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
}

type kubelet struct {
	ctx        context.Context
	ctrl, node *grpc.ClientConn
	cap        *csi.VolumeCapability
	readonly   bool
}

// call runs one CSI call and prints it: "Name OK in 12ms", or its code
// and message.
func call(name string, f func() error) error {
	start := time.Now()
	err := f()
	if err != nil {
		st := status.Convert(err)
		return fmt.Errorf("%s: %s: %s", name, st.Code(), st.Message())
	}
	fmt.Printf("%s OK in %.1fms\n", name, float64(time.Since(start).Microseconds())/1000)
	return nil
}

func (k *kubelet) create(name string, ps params) error {
	p := map[string]string{}
	for _, kv := range ps {
		key, v, _ := strings.Cut(kv, "=")
		p[key] = v
	}
	return call("CreateVolume", func() error {
		r, err := csi.NewControllerClient(k.ctrl).CreateVolume(k.ctx, &csi.CreateVolumeRequest{Name: name, Parameters: p,
			VolumeCapabilities: []*csi.VolumeCapability{k.cap}})
		if err == nil {
			fmt.Println("volume", r.Volume.VolumeId)
		}
		return err
	})
}

// paths are the kubelet's for a block volume: a staging directory per
// volume, a device file per pod.
func paths(root, volume, pod string) (staging, target string) {
	sum := sha256.Sum256([]byte(volume))
	h := hex.EncodeToString(sum[:8])
	return filepath.Join(root, "plugins", "staging", h), filepath.Join(root, "pods", pod, "volumeDevices", h)
}

func (k *kubelet) nodeID() (string, error) {
	r, err := csi.NewNodeClient(k.node).NodeGetInfo(k.ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return "", fmt.Errorf("NodeGetInfo: %v", err)
	}
	return r.NodeId, nil
}

func (k *kubelet) attach(volume, pod, root string) error {
	node, err := k.nodeID()
	if err != nil {
		return err
	}
	fmt.Println("node", node)
	staging, target := paths(root, volume, pod)
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return err
	}
	var pub map[string]string
	cc, nc := csi.NewControllerClient(k.ctrl), csi.NewNodeClient(k.node)
	if err := call("ControllerPublishVolume", func() error {
		r, err := cc.ControllerPublishVolume(k.ctx, &csi.ControllerPublishVolumeRequest{VolumeId: volume, NodeId: node,
			VolumeCapability: k.cap, Readonly: k.readonly})
		if err == nil {
			pub = r.PublishContext
			fmt.Printf("publish context: job %s generation %s\n", pub["job"], pub["generation"])
		}
		return err
	}); err != nil {
		return err
	}
	if err := call("NodeStageVolume", func() error {
		_, err := nc.NodeStageVolume(k.ctx, &csi.NodeStageVolumeRequest{VolumeId: volume, StagingTargetPath: staging,
			VolumeCapability: k.cap, PublishContext: pub})
		return err
	}); err != nil {
		return err
	}
	if err := call("NodePublishVolume", func() error {
		_, err := nc.NodePublishVolume(k.ctx, &csi.NodePublishVolumeRequest{VolumeId: volume, StagingTargetPath: staging,
			TargetPath: target, VolumeCapability: k.cap, Readonly: k.readonly, PublishContext: pub})
		return err
	}); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return err
	}
	kind := "not a block device"
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		kind = fmt.Sprintf("block device %d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	}
	fmt.Printf("target %s: %s\n", target, kind)
	return nil
}

func (k *kubelet) detach(volume, pod, root string) error {
	node, err := k.nodeID()
	if err != nil {
		return err
	}
	staging, target := paths(root, volume, pod)
	cc, nc := csi.NewControllerClient(k.ctrl), csi.NewNodeClient(k.node)
	if err := call("NodeUnpublishVolume", func() error {
		_, err := nc.NodeUnpublishVolume(k.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volume, TargetPath: target})
		return err
	}); err != nil {
		return err
	}
	if _, err := os.Stat(target); err == nil {
		return fmt.Errorf("NodeUnpublishVolume left %s", target)
	}
	if err := call("NodeUnstageVolume", func() error {
		_, err := nc.NodeUnstageVolume(k.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volume, StagingTargetPath: staging})
		return err
	}); err != nil {
		return err
	}
	return call("ControllerUnpublishVolume", func() error {
		_, err := cc.ControllerUnpublishVolume(k.ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: volume, NodeId: node})
		return err
	})
}
