package nvmegate_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate"
)

// field returns the Field of an EINVALID error, or a marker for anything else.
func field(err error) string {
	var e *nvmegate.Error
	if err == nil {
		return ""
	}
	if !errors.As(err, &e) || e.Code != nvmegate.EINVALID {
		return "<not EINVALID: " + err.Error() + ">"
	}
	return e.Field
}

func validTarget() nvmegate.Target {
	return nvmegate.Target{ID: "stor-1", Fabric: "fab", Region: "eu-west", Driver: nvmegate.DriverNVMet, Ports: []nvmegate.Port{
		{ID: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "10.0.0.1", ServiceID: "4420"},
		{ID: 2, Transport: "tcp", AddressFamily: "ipv6", Address: "fd00::1", ServiceID: "4421", SecureChannel: "required"},
	}}
}

func TestTargetValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mut   func(*nvmegate.Target)
		field string
	}{
		{"valid", func(*nvmegate.Target) {}, ""},
		{"id uppercase", func(x *nvmegate.Target) { x.ID = "Stor" }, "id"},
		{"id too long", func(x *nvmegate.Target) { x.ID = strings.Repeat("a", 64) }, "id"},
		{"no region", func(x *nvmegate.Target) { x.Region = "" }, "region"},
		{"bad rack", func(x *nvmegate.Target) { x.Rack = "-r" }, "rack"},
		{"bad driver", func(x *nvmegate.Target) { x.Driver = "iscsi" }, "driver"},
		{"no ports", func(x *nvmegate.Target) { x.Ports = nil }, "ports"},
		{"port id 0", func(x *nvmegate.Target) { x.Ports[0].ID = 0 }, "ports[0].id"},
		{"duplicate port", func(x *nvmegate.Target) { x.Ports[1].ID = 1 }, "ports[1].id"},
		{"bad transport", func(x *nvmegate.Target) { x.Ports[0].Transport = "fc" }, "ports[0].transport"},
		{"ipv6 address for ipv4", func(x *nvmegate.Target) { x.Ports[0].Address = "fd00::1" }, "ports[0].address"},
		{"mapped ipv4 for ipv6", func(x *nvmegate.Target) { x.Ports[1].Address = "::ffff:10.0.0.1" }, "ports[1].address"},
		{"zone", func(x *nvmegate.Target) { x.Ports[1].Address = "fe80::1%eth0" }, "ports[1].address"},
		{"hostname", func(x *nvmegate.Target) { x.Ports[0].Address = "stor1.example.org" }, "ports[0].address"},
		{"bad family", func(x *nvmegate.Target) { x.Ports[0].AddressFamily = "ib" }, "ports[0].address_family"},
		{"service 0", func(x *nvmegate.Target) { x.Ports[0].ServiceID = "0" }, "ports[0].service_id"},
		{"service leading zero", func(x *nvmegate.Target) { x.Ports[0].ServiceID = "04420" }, "ports[0].service_id"},
		{"service too big", func(x *nvmegate.Target) { x.Ports[0].ServiceID = "65536" }, "ports[0].service_id"},
		{"bad secure channel", func(x *nvmegate.Target) { x.Ports[0].SecureChannel = "tls1.2" }, "ports[0].secure_channel"},
		{"tls on rdma", func(x *nvmegate.Target) { x.Ports[0].Transport = "rdma"; x.Ports[0].SecureChannel = "optional" }, "ports[0].secure_channel"},
	} {
		tg := validTarget()
		tc.mut(&tg)
		if got := field(tg.Validate()); got != tc.field {
			t.Errorf("%s: field %q, want %q", tc.name, got, tc.field)
		}
	}
}

func TestSubsystemNamespaceBindingValidate(t *testing.T) {
	sub := func(mut func(*nvmegate.Subsystem)) error {
		s := nvmegate.Subsystem{NQN: "nqn.2026-01.io.example:s", TargetID: "stor-1", Tenant: "acme", PortIDs: []uint16{1}, DHCHAP: true}
		mut(&s)
		return s.Validate()
	}
	ns := func(mut func(*nvmegate.Namespace)) error {
		n := nvmegate.Namespace{SubsystemNQN: "nqn.2026-01.io.example:s", NSID: 1, Tenant: "acme", Region: "eu-west", DataClass: "internal",
			Dataset: nvmegate.Dataset{Name: "cc/2026-10", Digest: "sha256:" + strings.Repeat("ab", 32)}}
		mut(&n)
		return n.Validate()
	}
	hb := func(mut func(*nvmegate.HostBinding)) error {
		h := nvmegate.HostBinding{SPIFFEID: "spiffe://example.org/node/gpu-1", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:f81d4fae-7dec-11d0-a765-00a0c91e6bf6"}
		mut(&h)
		return h.Validate()
	}
	for _, tc := range []struct {
		name  string
		err   error
		field string
	}{
		{"subsystem valid", sub(func(*nvmegate.Subsystem) {}), ""},
		{"subsystem no auth", sub(func(s *nvmegate.Subsystem) { s.DHCHAP = false }), "dhchap"},
		{"subsystem tls only", sub(func(s *nvmegate.Subsystem) { s.DHCHAP, s.TLS = false, true }), ""},
		{"subsystem duplicate port", sub(func(s *nvmegate.Subsystem) { s.PortIDs = []uint16{1, 1} }), "port_ids[1]"},
		{"subsystem no ports", sub(func(s *nvmegate.Subsystem) { s.PortIDs = nil }), "port_ids"},
		{"subsystem tenant", sub(func(s *nvmegate.Subsystem) { s.Tenant = "" }), "tenant"},
		{"subsystem description", sub(func(s *nvmegate.Subsystem) { s.Description = "a\nb" }), "description"},
		{"namespace valid", ns(func(*nvmegate.Namespace) {}), ""},
		{"namespace nsid 0", ns(func(n *nvmegate.Namespace) { n.NSID = 0 }), "nsid"},
		{"namespace broadcast nsid", ns(func(n *nvmegate.Namespace) { n.NSID = 0xFFFFFFFF }), "nsid"},
		{"namespace digest", ns(func(n *nvmegate.Namespace) { n.Dataset.Digest = "sha256:ABC" }), "dataset.digest"},
		{"namespace dataset", ns(func(n *nvmegate.Namespace) { n.Dataset.Name = "../etc" }), "dataset.name"},
		{"namespace class", ns(func(n *nvmegate.Namespace) { n.DataClass = "Top Secret" }), "data_class"},
		{"binding valid", hb(func(*nvmegate.HostBinding) {}), ""},
		{"binding not spiffe", hb(func(h *nvmegate.HostBinding) { h.SPIFFEID = "https://example.org/node/x" }), "spiffe_id"},
		{"binding of an admin", hb(func(h *nvmegate.HostBinding) { h.SPIFFEID = "spiffe://example.org/admin/ops" }), "spiffe_id"},
		{"binding of a target agent", hb(func(h *nvmegate.HostBinding) { h.SPIFFEID = "spiffe://example.org/target/stor-1" }), "spiffe_id"},
		{"binding trust domain only", hb(func(h *nvmegate.HostBinding) { h.SPIFFEID = "spiffe://example.org" }), "spiffe_id"},
		{"binding nqn", hb(func(h *nvmegate.HostBinding) { h.HostNQN = "host-1" }), "host_nqn"},
		{"binding tenant", hb(func(h *nvmegate.HostBinding) { h.Tenant = "ACME" }), "tenant"},
	} {
		if got := field(tc.err); got != tc.field {
			t.Errorf("%s: field %q, want %q (%v)", tc.name, got, tc.field, tc.err)
		}
	}
}

func TestJobValidate(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	valid := func() nvmegate.Job {
		return nvmegate.Job{ID: "slurm:1234", Tenant: "acme", Nodes: []string{"spiffe://example.org/node/a"},
			Namespaces:     []nvmegate.JobNamespace{{SubsystemNQN: "nqn.2026-01.io.example:s", NSID: 1, Mode: nvmegate.ModeReadOnly}},
			AllowedRegions: []string{"eu-west"}, ExpiresAt: now.Add(time.Hour)}
	}
	for _, tc := range []struct {
		name  string
		mut   func(*nvmegate.Job)
		field string
	}{
		{"valid", func(*nvmegate.Job) {}, ""},
		{"job id", func(j *nvmegate.Job) { j.ID = "a b" }, "job_id"},
		{"duplicate node", func(j *nvmegate.Job) { j.Nodes = append(j.Nodes, j.Nodes[0]) }, "nodes[1]"},
		{"admin as node", func(j *nvmegate.Job) { j.Nodes = append(j.Nodes, "spiffe://example.org/admin/ops") }, "nodes[1]"},
		{"scheduler as node", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org/tenant/acme/scheduler/slurm" }, "nodes[0]"},
		{"target as node", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org/target/stor-1" }, "nodes[0]"},
		{"trust domain as node", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org" }, "nodes[0]"},
		{"node sub-path", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org/node/a/b" }, "nodes[0]"},
		{"node prefix only", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org/node" }, "nodes[0]"},
		{"nodes path", func(j *nvmegate.Job) { j.Nodes[0] = "spiffe://example.org/nodes/a" }, "nodes[0]"},
		{"mode", func(j *nvmegate.Job) { j.Namespaces[0].Mode = "wo" }, "namespaces[0].mode"},
		{"no regions", func(j *nvmegate.Job) { j.AllowedRegions = nil }, "allowed_regions"},
		{"expired", func(j *nvmegate.Job) { j.ExpiresAt = now }, "expires_at"},
	} {
		j := valid()
		tc.mut(&j)
		if got := field(j.Validate(now)); got != tc.field {
			t.Errorf("%s: field %q, want %q", tc.name, got, tc.field)
		}
	}
}

// A job's node that is another workload is refused naming it, so the
// scheduler sees which entry is wrong.
func TestValidateNodeID(t *testing.T) {
	for _, ok := range []string{"spiffe://example.org/node/gpu-1", "spiffe://nvmegate.test/node/acme.gpu_17"} {
		if err := nvmegate.ValidateNodeID("nodes[0]", ok); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v", ok, err)
		}
	}
	err := nvmegate.ValidateNodeID("nodes[3]", "spiffe://example.org/admin/ops")
	if field(err) != "nodes[3]" || !strings.Contains(err.Error(), `"spiffe://example.org/admin/ops"`) || !strings.Contains(err.Error(), "/node/<host>") {
		t.Errorf("admin: %v", err)
	}
}

func TestErrors(t *testing.T) {
	inner := nvmegate.Invalid("region", "must be a label")
	err := nvmegate.WithFieldPrefix("namespace", inner)
	if err.Error() != "namespace.region: must be a label" || field(err) != "namespace.region" {
		t.Fatalf("prefixed: %v", err)
	}
	if field(inner) != "region" {
		t.Fatal("WithFieldPrefix changed its argument")
	}
	notFound := nvmegate.Errorf(nvmegate.ENOTFOUND, "no target %q", "x")
	if nvmegate.WithFieldPrefix("target", notFound) != notFound {
		t.Fatal("non-EINVALID errors must pass through unchanged")
	}
	// Internal errors never show their text.
	plain := errors.New("open /var/lib/nvmegate/x: permission denied")
	if nvmegate.ErrorCode(plain) != nvmegate.EINTERNAL || nvmegate.ErrorMessage(plain) != "internal error" {
		t.Fatalf("plain error: %q %q", nvmegate.ErrorCode(plain), nvmegate.ErrorMessage(plain))
	}
	if nvmegate.ErrorCode(nil) != "" || nvmegate.ErrorMessage(nil) != "" {
		t.Fatal("nil error")
	}
	// Long caller input is cut in messages.
	msg := nvmegate.ValidateLabel("x", strings.Repeat("Z", 500)).Error()
	if len(msg) > 200 {
		t.Fatalf("message echoes too much input: %d bytes", len(msg))
	}
}
