package nvmegate

import (
	"strings"
	"testing"
)

// A binding's segment and a port's subnet are canonical CIDR prefixes; a
// port's subnet holds its address.
func TestSegmentValidation(t *testing.T) {
	h := HostBinding{SPIFFEID: "spiffe://example.org/node/n1", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:0c6f2d46-2b8c-5b0e-9b7a-6a3e2b1d7f10"}
	for _, bad := range [][]string{{"10.1.2.3/16"}, {"10.1.0.0"}, {"x"}, {"10.1.0.0/16", "10.1.0.0/16"}, {"fe80::%eth0/64"}} {
		h.Subnets = bad
		if err := h.Validate(); err == nil || ErrorCode(err) != EINVALID || !strings.Contains(err.Error(), "subnets[") {
			t.Errorf("subnets %v: %v", bad, err)
		}
	}
	h.Subnets = make([]string, MaxSubnets+1)
	if err := h.Validate(); err == nil {
		t.Error("17 subnets accepted")
	}
	h.Subnets = []string{"10.1.0.0/16", "fd00::/8"}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	p := Port{ID: 1, Transport: TransportTCP, AddressFamily: FamilyIPv4, Address: "10.1.2.3", ServiceID: "4420", Subnet: "10.1.2.0/24"}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"10.9.0.0/24", "10.1.2.3/24", "nope"} {
		p.Subnet = bad
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "subnet") {
			t.Errorf("port subnet %q: %v", bad, err)
		}
	}
}

// Reaches: an unsegmented node reaches every port; a segmented one the
// ports serving a subnet inside its own, never a port without a subnet.
func TestReaches(t *testing.T) {
	port := func(s string) Port { return Port{Subnet: s} }
	none := HostBinding{}
	seg := HostBinding{Subnets: []string{"10.1.0.0/16"}}
	for _, c := range []struct {
		h    HostBinding
		p    Port
		want bool
	}{
		{none, port(""), true}, {none, port("10.9.0.0/24"), true},
		{seg, port("10.1.2.0/24"), true}, {seg, port("10.1.0.0/16"), true},
		{seg, port("10.0.0.0/8"), false}, {seg, port("10.2.0.0/24"), false}, {seg, port(""), false}, {seg, port("fd00::/64"), false},
	} {
		if got := c.h.Reaches(c.p); got != c.want {
			t.Errorf("%v reaches %q: %t, want %t", c.h.Subnets, c.p.Subnet, got, c.want)
		}
	}
}
