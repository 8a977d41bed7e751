package csidriver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Identity is the CSI Identity service, the same in both plugins.
type Identity struct {
	csi.UnimplementedIdentityServer
	// Name is the driver's name; "" is DriverName. A cluster shared by
	// tenants runs one driver per tenant, each under its own name: every
	// attacher handles every attachment of its driver's name, and a
	// tenant's controller must not be asked for another's.
	Name    string
	Version string
}

// GetPluginInfo names the driver.
func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	name := i.Name
	if name == "" {
		name = DriverName
	}
	return &csi.GetPluginInfoResponse{Name: name, VendorVersion: i.Version}, nil
}

// GetPluginCapabilities says the driver has a Controller service. It is
// the driver's capability, not the process's: the node plugin says it
// too, since a CO (and csi-sanity) asks the node plugin whether volumes
// are published by a controller before they are staged.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

// Probe answers ready: the driver holds no state that must load first;
// the gateway's own answers say when it is down.
func (i *Identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
