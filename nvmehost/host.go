package nvmehost

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Host is the NVMe-oF host of this machine's kernel.
type Host struct {
	// Fabrics is the fabrics control device; "" is /dev/nvme-fabrics.
	Fabrics string
	// Class is the NVMe controller class directory; "" is /sys/class/nvme.
	Class string
	// Params is nvme_core's module parameters; "" is
	// /sys/module/nvme_core/parameters.
	Params string
}

// Controller is one NVMe controller the kernel made: its device name
// ("nvme3") and controller ID on the subsystem.
type Controller struct {
	Name   string
	CntlID int
}

// Info is what sysfs says about a controller. It holds no secret.
type Info struct {
	Name      string // nvme3
	State     string // live, connecting, resetting, deleting, ...
	Transport string // tcp, rdma, loop
	Address   string // traddr=...,trsvcid=...
	SubNQN    string
	HostNQN   string
}

// ErrNoController reports a controller that is not (or no longer) there.
var ErrNoController = errors.New("nvmehost: no such controller")

func (h *Host) fabrics() string {
	if h.Fabrics != "" {
		return h.Fabrics
	}
	return "/dev/nvme-fabrics"
}

func (h *Host) class() string {
	if h.Class != "" {
		return h.Class
	}
	return "/sys/class/nvme"
}

// Connect creates a controller from the option string opts (see
// nvmefmt.Connection.KernelOptions): the kernel connects the admin and I/O
// queues, authenticating as opts say, before the write returns, and the
// answer read back on the same descriptor names the controller. The error
// is the kernel's (ECONNREFUSED, EKEYREJECTED, EIO, ...), never opts.
func (h *Host) Connect(opts string) (Controller, error) {
	f, err := os.OpenFile(h.fabrics(), os.O_RDWR, 0)
	if err != nil {
		return Controller{}, fmt.Errorf("nvmehost: %w (is nvme-fabrics loaded?)", err)
	}
	defer f.Close()
	return connect(f, opts)
}

// connect is Connect on an open fabrics device: one write of the whole
// option string, then one read of the answer.
func connect(f io.ReadWriter, opts string) (Controller, error) {
	if _, err := io.WriteString(f, opts); err != nil {
		return Controller{}, fmt.Errorf("nvmehost: connect: %w", unwrapPath(err))
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil && !errors.Is(err, io.EOF) {
		return Controller{}, fmt.Errorf("nvmehost: connect: read the new controller: %w", unwrapPath(err))
	}
	return ParseReply(string(buf[:n]))
}

// unwrapPath drops the *PathError's path and operation: the errno is what
// the kernel said.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// ParseReply parses what /dev/nvme-fabrics answers after a connect:
// "instance=<n>,cntlid=<id>" and a line break.
func ParseReply(s string) (Controller, error) {
	var c Controller
	instance := -1
	c.CntlID = -1
	for _, kv := range strings.Split(strings.TrimSpace(s), ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			return Controller{}, fmt.Errorf("nvmehost: unexpected fabrics answer %q", truncate(s))
		}
		switch k {
		case "instance":
			instance = n
		case "cntlid":
			c.CntlID = n
		}
	}
	if instance < 0 || c.CntlID < 0 {
		return Controller{}, fmt.Errorf("nvmehost: unexpected fabrics answer %q", truncate(s))
	}
	c.Name = "nvme" + strconv.Itoa(instance)
	return c, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

var nameRE = regexp.MustCompile(`^nvme[0-9]+$`)

func (h *Host) attr(name, a string) (string, error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("nvmehost: %q is not a controller name", name)
	}
	return filepath.Join(h.class(), name, a), nil
}

func (h *Host) open(name, a string) (*os.File, error) {
	p, err := h.attr(name, a)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoController, name)
	}
	if err != nil {
		return nil, fmt.Errorf("nvmehost: %s: %w", name, err)
	}
	return f, nil
}

func (h *Host) write(name, a, v string) error {
	f, err := h.open(name, a)
	if err != nil {
		return err
	}
	// One write: sysfs takes an attribute's value in a single store.
	_, werr := io.WriteString(f, v)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("nvmehost: %s: write %s: %w", name, a, unwrapPath(werr))
	}
	return nil
}

// SetDHCHAP hands the live controller name new DH-HMAC-CHAP secrets: the
// host's and then the controller's (for bidirectional authentication; ""
// for none). Each store starts a re-authentication of the controller,
// which the kernel runs in place. Their order matters when both change,
// as a rotation changes both: the target already holds both new keys, and
// a re-authentication that presents the old host secret fails on the
// target, which then drops the controller (a reconnect; seen on Linux 6.1
// with ctrl-first). Host-first, the first re-authentication presents the
// new host secret and checks the controller's answer only a DH exchange
// and two round trips later, by when the second store has replaced the
// controller's secret; the second re-authentication uses both.
func (h *Host) SetDHCHAP(name, hostSecret, ctrlSecret string) error {
	if hostSecret == "" {
		return errors.New("nvmehost: no DH-HMAC-CHAP secret to set")
	}
	// Both attributes are opened before either is written: the second
	// store follows the first as closely as it can.
	hf, err := h.open(name, "dhchap_secret")
	if err != nil {
		return err
	}
	defer hf.Close()
	var cf *os.File
	if ctrlSecret != "" {
		if cf, err = h.open(name, "dhchap_ctrl_secret"); err != nil {
			return err
		}
		defer cf.Close()
	}
	// Without a trailing newline: the kernel compares and parses what it
	// is given as is.
	if _, err := io.WriteString(hf, hostSecret); err != nil {
		return fmt.Errorf("nvmehost: %s: write dhchap_secret: %w", name, unwrapPath(err))
	}
	if cf != nil {
		if _, err := io.WriteString(cf, ctrlSecret); err != nil {
			return fmt.Errorf("nvmehost: %s: write dhchap_ctrl_secret: %w", name, unwrapPath(err))
		}
	}
	return nil
}

// Delete deletes the controller name: the kernel tears down its queues and
// block devices and returns once it is gone. A controller already gone is
// ErrNoController.
func (h *Host) Delete(name string) error {
	return h.write(name, "delete_controller", "1")
}

// Multipath reports whether native NVMe multipath is on: controllers to
// one subsystem are paths under one block device (nvme_core's multipath
// parameter; distributions build it in and turn it on).
func (h *Host) Multipath() bool {
	dir := h.Params
	if dir == "" {
		dir = "/sys/module/nvme_core/parameters"
	}
	b, err := os.ReadFile(filepath.Join(dir, "multipath"))
	return err == nil && strings.TrimSpace(string(b)) == "Y"
}

// nsRE matches a controller's namespace entries in sysfs: nvme0n1 without
// multipath, the path nvme0c1n1 (subsystem 0, controller 1) with it; the
// groups are the block device's instance and the namespace ID.
var nsRE = regexp.MustCompile(`^nvme([0-9]+)(?:c[0-9]+)?n([0-9]+)$`)

// Namespaces lists the namespace IDs controller name serves now: those
// the kernel has scanned and attached (under multipath, a path of the
// namespace's block device). A scan runs after the connect returns, so a
// new controller lists none at first.
func (h *Host) Namespaces(name string) ([]string, error) {
	return h.namespaceEntries(name, func(m []string) string { return m[2] })
}

// Devices lists the block devices (/dev/nvme0n1) of the namespaces
// controller name serves now. Under multipath a namespace's device is
// named by its subsystem's instance, not the controller's: the path
// nvme0c1n1 is /dev/nvme0n1.
func (h *Host) Devices(name string) ([]string, error) {
	return h.namespaceEntries(name, func(m []string) string { return "/dev/nvme" + m[1] + "n" + m[2] })
}

// Device names the block device of namespace nsid behind controller
// name, "" while the kernel has not attached it. The entry's own nsid
// attribute decides: the n<N> of a device's name is an instance number
// the kernel hands out per subsystem, which equals the namespace ID only
// when namespaces were scanned in order.
func (h *Host) Device(name string, nsid uint32) (string, error) {
	dir, err := h.attr(name, "")
	if err != nil {
		return "", err
	}
	want := strconv.FormatUint(uint64(nsid), 10)
	devs, err := h.namespaceEntries(name, func(m []string) string {
		id := m[2]
		if b, err := os.ReadFile(filepath.Join(dir, m[0], "nsid")); err == nil {
			id = strings.TrimSpace(string(b))
		}
		if id != want {
			return ""
		}
		return "/dev/nvme" + m[1] + "n" + m[2]
	})
	for _, d := range devs {
		if d != "" {
			return d, nil
		}
	}
	return "", err
}

// namespaceEntries maps each namespace entry of controller name's sysfs
// directory (nsRE's submatches) through fn.
func (h *Host) namespaceEntries(name string, fn func(m []string) string) ([]string, error) {
	dir, err := h.attr(name, "")
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNoController, name)
	}
	if err != nil {
		return nil, fmt.Errorf("nvmehost: %s: %w", name, err)
	}
	var out []string
	for _, e := range ents {
		if m := nsRE.FindStringSubmatch(e.Name()); m != nil {
			out = append(out, fn(m))
		}
	}
	return out, nil
}

// Controllers lists the controllers sysfs shows, with what they connect.
func (h *Host) Controllers() ([]Info, error) {
	ents, err := os.ReadDir(h.class())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nvmehost: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !nameRE.MatchString(e.Name()) {
			continue
		}
		in, err := h.Info(e.Name())
		if errors.Is(err, ErrNoController) {
			continue // deleted while listed
		}
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// Info reads controller name's attributes.
func (h *Host) Info(name string) (Info, error) {
	in := Info{Name: name}
	for _, a := range []struct {
		attr string
		to   *string
	}{{"state", &in.State}, {"transport", &in.Transport}, {"address", &in.Address}, {"subsysnqn", &in.SubNQN}, {"hostnqn", &in.HostNQN}} {
		p, err := h.attr(name, a.attr)
		if err != nil {
			return Info{}, err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			return Info{}, fmt.Errorf("%w: %s", ErrNoController, name)
		}
		if err != nil {
			return Info{}, fmt.Errorf("nvmehost: %s: %w", name, err)
		}
		*a.to = strings.TrimSpace(string(b))
	}
	return in, nil
}
