package csidriver

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
)

// modeOf is the namespace mode a volume capability asks for: read-only for
// the reader modes and for readonly publishes; read-write for a single
// node's writer. A namespace written from several nodes at once, or
// mounted as a file system, is refused: nvmegate hands out raw namespaces,
// and two writers without a cluster file system corrupt them.
func modeOf(c *csi.VolumeCapability, readonly bool) (string, error) {
	if c == nil {
		return "", status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if c.GetBlock() == nil {
		return "", status.Error(codes.InvalidArgument, "nvmegate volumes are raw block devices: use volumeMode: Block (access type mount is not supported)")
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		return nvmegate.ModeReadOnly, nil
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:
		if readonly {
			return nvmegate.ModeReadOnly, nil
		}
		return nvmegate.ModeReadWrite, nil
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return "", status.Error(codes.InvalidArgument, "volume_capability.access_mode is required")
	default:
		return "", status.Errorf(codes.InvalidArgument, "access mode %s is not supported: a namespace is read by many nodes (ReadOnlyMany) or written by one (ReadWriteOnce)",
			c.GetAccessMode().GetMode())
	}
}

// checkCaps checks every capability of a CreateVolume or a
// ValidateVolumeCapabilities.
func checkCaps(cs []*csi.VolumeCapability) error {
	if len(cs) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	for _, c := range cs {
		if _, err := modeOf(c, false); err != nil {
			return err
		}
	}
	return nil
}

// singleNode reports whether a capability's access mode is one node's.
func singleNode(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:
		return true
	}
	return false
}
