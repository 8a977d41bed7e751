package cryptdev

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Cipher is the dm-crypt cipher: AES-XTS with the sector number as IV,
// a 512-bit key (AES-256 in XTS's two halves).
const (
	Cipher  = "aes-xts-plain64"
	KeySize = 64 // bytes
)

// Prefix starts the name of every mapping this package makes.
const Prefix = "nvmegate-"

// Cryptsetup opens and closes mappings with the cryptsetup binary.
type Cryptsetup struct {
	// Binary is cryptsetup's path; "" finds it in PATH.
	Binary string
	// MapperDir is where mappings appear; "" is /dev/mapper.
	MapperDir string
	// Timeout bounds one cryptsetup run; 0 is 30 s.
	Timeout time.Duration
}

var nameRE = regexp.MustCompile(`^` + Prefix + `[0-9a-f]{16,64}$`)

// Name is the mapping name of a namespace (its key-store name,
// "<subsystem NQN>/<NSID>"): a digest, so that no NQN character reaches
// device-mapper.
func Name(namespace string) string {
	s := sha256.Sum256([]byte(namespace))
	return fmt.Sprintf("%s%x", Prefix, s[:12])
}

// XTSKey derives the dm-crypt key from a namespace's data key
// (HKDF-SHA256, labelled): the data key itself is never the volume key of
// anything else, and a 256-bit data key gives the 512 bits XTS takes.
func XTSKey(dataKey []byte) ([]byte, error) {
	if len(dataKey) < 32 {
		return nil, fmt.Errorf("cryptdev: a %d-byte data key is too short (want 32 or more)", len(dataKey))
	}
	return hkdf.Key(sha256.New, dataKey, nil, "nvmegate dm-crypt "+Cipher+" v1", KeySize)
}

func (c *Cryptsetup) mapperDir() string {
	if c.MapperDir != "" {
		return c.MapperDir
	}
	return "/dev/mapper"
}

// Path is where mapping name appears.
func (c *Cryptsetup) Path(name string) string { return filepath.Join(c.mapperDir(), name) }

func (c *Cryptsetup) run(stdin []byte, args ...string) (string, error) {
	bin := c.Binary
	if bin == "" {
		bin = "cryptsetup"
	}
	t := c.Timeout
	if t <= 0 {
		t = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), t)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// Status is what dm-crypt says of an open mapping.
type Status struct {
	Active bool
	Device string // the backing device
	Cipher string
}

// Status reads mapping name ("cryptsetup status").
func (c *Cryptsetup) Status(name string) (Status, error) {
	if !nameRE.MatchString(name) {
		return Status{}, fmt.Errorf("cryptdev: %q is not a mapping of ours", name)
	}
	out, err := c.run(nil, "status", name)
	var ee *exec.ExitError
	if errors.As(err, &ee) && !strings.Contains(out, "is active") {
		return Status{}, nil // inactive or absent: cryptsetup exits 4
	}
	if err != nil {
		return Status{}, fmt.Errorf("cryptdev: status %s: %v: %s", name, err, out)
	}
	return parseStatus(out), nil
}

// parseStatus reads "cryptsetup status" output: a first line "<path> is
// active[ and is in use]." and "  key: value" lines.
func parseStatus(out string) Status {
	var s Status
	for i, line := range strings.Split(out, "\n") {
		if i == 0 {
			s.Active = strings.Contains(line, " is active")
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "device":
			s.Device = strings.TrimSpace(v)
		case "cipher":
			s.Cipher = strings.TrimSpace(v)
		}
	}
	return s
}

// Open maps device as name with the dm-crypt key derived from dataKey and
// returns the mapped device's path. A mapping already open on the same
// device is kept (the agent re-applies its state; a restarted agent finds
// its mappings): dm-crypt does not tell its key, so a mapping made with
// another key reads garbage, which Close and Open again would not fix
// either — the key of a namespace does not change under a mapping.
func (c *Cryptsetup) Open(name, device string, dataKey []byte) (string, error) {
	if !nameRE.MatchString(name) {
		return "", fmt.Errorf("cryptdev: %q is not a mapping of ours", name)
	}
	st, err := c.Status(name)
	if err != nil {
		return "", err
	}
	if st.Active {
		if st.Device != device {
			return "", fmt.Errorf("cryptdev: mapping %s is open on %s, not %s", name, st.Device, device)
		}
		return c.Path(name), nil
	}
	key, err := XTSKey(dataKey)
	if err != nil {
		return "", err
	}
	defer clear(key)
	// Plain mode: no header; --key-file=- takes exactly key-size bytes
	// from stdin, and --hash plain uses them as the volume key (plain mode
	// hashes what it reads from stdin otherwise): the key dm-crypt holds is
	// XTSKey's, which Rekey re-encrypts with in userspace.
	out, err := c.run(key, "open", "--type", "plain", "--cipher", Cipher, "--key-size", "512", "--hash", "plain",
		"--key-file", "-", "--keyfile-size", "64", device, name)
	if err != nil {
		return "", fmt.Errorf("cryptdev: open %s on %s: %v: %s", name, device, err, out)
	}
	return c.Path(name), nil
}

// Close removes mapping name; a mapping that is not open is not an error.
func (c *Cryptsetup) Close(name string) error {
	st, err := c.Status(name)
	if err != nil || !st.Active {
		return err
	}
	if out, err := c.run(nil, "close", name); err != nil {
		return fmt.Errorf("cryptdev: close %s: %v: %s", name, err, out)
	}
	return nil
}

// List names the mappings of ours that are open.
func (c *Cryptsetup) List() ([]string, error) {
	ents, err := os.ReadDir(c.mapperDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cryptdev: %w", err)
	}
	var out []string
	for _, e := range ents {
		if nameRE.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
