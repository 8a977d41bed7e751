package nvmehost

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParseReply(t *testing.T) {
	for in, want := range map[string]Controller{
		"instance=3,cntlid=1\n":   {Name: "nvme3", CntlID: 1},
		"instance=0,cntlid=65519": {Name: "nvme0", CntlID: 65519},
	} {
		got, err := ParseReply(in)
		if err != nil || got != want {
			t.Errorf("ParseReply(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "instance=3", "cntlid=1", "instance=-1,cntlid=1", "instance=x,cntlid=1", "garbage"} {
		if _, err := ParseReply(in); err == nil {
			t.Errorf("ParseReply(%q) succeeded", in)
		}
	}
}

func FuzzParseReply(f *testing.F) {
	f.Add("instance=3,cntlid=1\n")
	f.Add("instance=,cntlid=")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseReply(s)
		if err == nil && (!nameRE.MatchString(c.Name) || c.CntlID < 0) {
			t.Fatalf("ParseReply(%q) = %+v", s, c)
		}
	})
}

// fabricsDev follows /dev/nvme-fabrics: a write of an option string
// creates a controller (or fails with the kernel's errno) and the next
// read answers with it.
type fabricsDev struct {
	wrote  string
	err    error
	answer string
}

func (d *fabricsDev) Write(p []byte) (int, error) {
	if d.err != nil {
		return 0, d.err
	}
	d.wrote = string(p)
	d.answer = "instance=4,cntlid=2\n"
	return len(p), nil
}

func (d *fabricsDev) Read(p []byte) (int, error) {
	return copy(p, d.answer), nil
}

func TestConnect(t *testing.T) {
	d := &fabricsDev{}
	c, err := connect(d, "nqn=n,transport=tcp,dhchap_secret=DHHC-1:00:secret:")
	if err != nil || c.Name != "nvme4" || c.CntlID != 2 {
		t.Fatalf("connect = %+v, %v", c, err)
	}
	d = &fabricsDev{err: &os.PathError{Op: "write", Path: "/dev/nvme-fabrics", Err: syscall.EKEYREJECTED}}
	_, err = connect(d, "nqn=n,dhchap_secret=DHHC-1:00:secret:")
	if !errors.Is(err, syscall.EKEYREJECTED) {
		t.Fatalf("a refused connect: %v, want EKEYREJECTED", err)
	}
	if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "/dev/") {
		t.Fatalf("the error repeats the options or the path: %v", err)
	}
}

// sysfsCtrl makes a controller directory with the attributes Info reads.
func sysfsCtrl(t *testing.T, class, name, sub string) {
	t.Helper()
	d := filepath.Join(class, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for a, v := range map[string]string{"state": "live\n", "transport": "tcp\n", "address": "traddr=127.0.0.1,trsvcid=4420\n",
		"subsysnqn": sub + "\n", "hostnqn": "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000\n",
		"dhchap_secret": "old\n", "dhchap_ctrl_secret": "old\n", "delete_controller": ""} {
		if err := os.WriteFile(filepath.Join(d, a), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMultipath(t *testing.T) {
	dir := t.TempDir()
	h := &Host{Params: dir}
	if h.Multipath() {
		t.Fatal("Multipath without the parameter")
	}
	for v, want := range map[string]bool{"Y\n": true, "N\n": false} {
		os.WriteFile(filepath.Join(dir, "multipath"), []byte(v), 0o644)
		if h.Multipath() != want {
			t.Errorf("multipath %q: Multipath() = %v", v, !want)
		}
	}
}

func TestSysfs(t *testing.T) {
	class := t.TempDir()
	h := &Host{Class: class}
	sysfsCtrl(t, class, "nvme1", "nqn.2026-01.io.example:a")
	sysfsCtrl(t, class, "nvme0", "nqn.2026-01.io.example:b")
	os.MkdirAll(filepath.Join(class, "nvme-subsys0"), 0o755) // not a controller
	cs, err := h.Controllers()
	if err != nil || len(cs) != 2 || cs[0].Name != "nvme0" || cs[1].SubNQN != "nqn.2026-01.io.example:a" || cs[1].State != "live" {
		t.Fatalf("Controllers = %+v, %v", cs, err)
	}
	if ids, err := h.Namespaces("nvme1"); err != nil || len(ids) != 0 {
		t.Errorf("Namespaces before a scan = %v, %v", ids, err)
	}
	for _, d := range []string{"nvme0c1n1", "nvme0c1n3", "nvme1n2", "ng0n1", "nvme0c1"} {
		os.MkdirAll(filepath.Join(class, "nvme1", d), 0o755)
	}
	if ids, err := h.Namespaces("nvme1"); err != nil || strings.Join(ids, ",") != "1,3,2" {
		t.Errorf("Namespaces = %v, %v; want paths n1, n3 and the plain n2", ids, err)
	}
	if _, err := h.Namespaces("nvme9"); !errors.Is(err, ErrNoController) {
		t.Errorf("Namespaces(gone) = %v", err)
	}
	// A path's block device is named by its subsystem's instance.
	if devs, err := h.Devices("nvme1"); err != nil || strings.Join(devs, ",") != "/dev/nvme0n1,/dev/nvme0n3,/dev/nvme1n2" {
		t.Errorf("Devices = %v, %v", devs, err)
	}
	if _, err := h.Devices("nvme9"); !errors.Is(err, ErrNoController) {
		t.Errorf("Devices(gone) = %v", err)
	}
	// The namespace ID is the entry's nsid attribute where there is one
	// (nvme1n2 serves namespace 5), its name's number where not.
	os.WriteFile(filepath.Join(class, "nvme1", "nvme1n2", "nsid"), []byte("5\n"), 0o644)
	for nsid, want := range map[uint32]string{5: "/dev/nvme1n2", 3: "/dev/nvme0n3", 2: ""} {
		if dev, err := h.Device("nvme1", nsid); err != nil || dev != want {
			t.Errorf("Device(nvme1, %d) = %q, %v; want %q", nsid, dev, err, want)
		}
	}
	if _, err := h.Device("nvme9", 1); !errors.Is(err, ErrNoController) {
		t.Errorf("Device(gone) = %v", err)
	}
	if err := h.SetDHCHAP("nvme1", "DHHC-1:01:new:", "DHHC-1:01:newctrl:"); err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]string{"dhchap_secret": "DHHC-1:01:new:", "dhchap_ctrl_secret": "DHHC-1:01:newctrl:"} {
		if b, _ := os.ReadFile(filepath.Join(class, "nvme1", a)); string(b) != want {
			t.Errorf("%s = %q, want %q (no newline)", a, b, want)
		}
	}
	if err := h.SetDHCHAP("nvme1", "", ""); err == nil {
		t.Error("SetDHCHAP without a secret succeeded")
	}
	if err := h.Delete("nvme0"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(class, "nvme0", "delete_controller")); string(b) != "1" {
		t.Errorf("delete_controller = %q", b)
	}
	if err := h.Delete("nvme7"); !errors.Is(err, ErrNoController) {
		t.Errorf("Delete(gone) = %v, want ErrNoController", err)
	}
	for _, bad := range []string{"../nvme0", "nvme0/..", "nvme-subsys0", ""} {
		if err := h.Delete(bad); err == nil || errors.Is(err, ErrNoController) {
			t.Errorf("Delete(%q) = %v, want a refusal of the name", bad, err)
		}
	}
}
