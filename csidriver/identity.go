package csidriver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Identity is the CSI Identity service; Controller says whether this
// process serves the Controller service too.
type Identity struct {
	csi.UnimplementedIdentityServer
	Version    string
	Controller bool
}

// GetPluginInfo names the driver.
func (i *Identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: i.Version}, nil
}

// GetPluginCapabilities says whether the Controller service is here.
func (i *Identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp := &csi.GetPluginCapabilitiesResponse{}
	if i.Controller {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}})
	}
	return resp, nil
}

// Probe answers ready: the driver holds no state that must load first;
// the gateway's own answers say when it is down.
func (i *Identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
