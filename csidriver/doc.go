// Package csidriver is nvmegate's Container Storage Interface driver: it
// lets Kubernetes attach existing dataset and checkpoint namespaces to a
// training job's pods, with nothing written by the cluster's engineers.
//
// CSI's calls map onto the gateway's:
//
//   - CreateVolume finds an existing dataset (static provisioning): the
//     volume handle names its subsystem NQN, its namespace ID and the
//     training job, "<nqn>/<nsid>@<job>". DeleteVolume deletes nothing.
//   - ControllerPublishVolume(volume, node) is the job's scheduler letting
//     the node in: it admits the job, or adds the node to it. Unpublishing
//     the last node finishes the job's run; the next publish admits the
//     next generation.
//   - NodeStageVolume is the node connecting with its grant (package
//     nodeagent, in-process): DH-HMAC-CHAP and TLS as the grant says, the
//     block device awaited, renewals for as long as the volume is staged.
//     NodeUnstageVolume disconnects and releases.
//   - NodePublishVolume bind-mounts the block device into the pod.
//
// Volumes are raw block devices (volumeMode: Block): a dataset is the
// namespace's bytes, which its digest in the inventory covers.
package csidriver
