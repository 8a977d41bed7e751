// Package csi holds the Kubernetes manifests of the nvmegate CSI driver; its test decodes each one strictly into Kubernetes' typed API objects.
package csi
