package vaulttest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	vault "github.com/hashicorp/vault/api"
)

// Version is the Vault release scripts/build-vault.sh builds by default.
const Version = "v1.21.0"

// Server is a running Vault dev server.
type Server struct {
	Addr   string        // http://127.0.0.1:PORT, or https:// with TLS
	Token  string        // the root token
	Client *vault.Client // authenticated with Token
	CACert string        // with TLS: the PEM file of the CA of Vault's certificate

	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the Vault binary to use: $NVMEGATE_VAULT, else the
// build script's cache path; "" if neither exists.
func Binary() string {
	if p := os.Getenv("NVMEGATE_VAULT"); p != "" {
		return p
	}
	cache := os.Getenv("TOOLS_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return ""
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "nvmegate", "tools")
	}
	p := filepath.Join(cache, "vault-"+Version, "vault")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// Option configures Start.
type Option func(*startOptions)

type startOptions struct{ tls bool }

// WithTLS serves HTTPS with a certificate of the dev server's own CA
// (Server.CACert), as certificate auth needs.
func WithTLS() Option { return func(o *startOptions) { o.tls = true } }

// Start starts a dev server for t and stops it when t ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		msg := "no Vault binary: run scripts/build-vault.sh (or set NVMEGATE_VAULT)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	tok := make([]byte, 16)
	rand.Read(tok)
	s := &Server{Addr: fmt.Sprintf("http://127.0.0.1:%d", port), Token: "root-" + hex.EncodeToString(tok), done: make(chan struct{})}
	home := t.TempDir() // the dev server writes ~/.vault-token
	logf, err := os.Create(filepath.Join(home, "vault.log"))
	if err != nil {
		t.Fatal(err)
	}
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	args := []string{"server", "-dev", "-dev-no-store-token", "-dev-root-token-id=" + s.Token, fmt.Sprintf("-dev-listen-address=127.0.0.1:%d", port)}
	if o.tls {
		certDir := t.TempDir()
		args = append(args, "-dev-tls", "-dev-tls-cert-dir="+certDir)
		s.Addr = fmt.Sprintf("https://127.0.0.1:%d", port)
		s.CACert = filepath.Join(certDir, "vault-ca.pem")
	}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = append(os.Environ(), "HOME="+home, "VAULT_ADDR=", "VAULT_TOKEN=")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); logf.Close(); close(s.done) }()
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("vault log:\n%s", tail(string(b), 40))
			}
		}
	})

	if err := s.waitReady(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	cfg := vault.DefaultConfig()
	cfg.Address = s.Addr
	if s.CACert != "" {
		if err := cfg.ConfigureTLS(&vault.TLSConfig{CACert: s.CACert}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Client, err = vault.NewClient(cfg); err != nil {
		t.Fatal(err)
	}
	s.Client.SetToken(s.Token)
	// transit/ for signing keys, nvmegate-kek/ for the namespace KEKs (as
	// deploy/vault/setup.sh mounts them).
	for _, m := range []string{"transit", "nvmegate-kek"} {
		if err := s.Client.Sys().Mount(m, &vault.MountInput{Type: "transit"}); err != nil {
			t.Fatalf("enable transit at %s: %v", m, err)
		}
	}
	return s
}

// waitReady polls the health endpoint; the deadline only bounds a server
// that never comes up.
func (s *Server) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("vault exited during start")
		default:
		}
		resp, err := s.healthClient().Get(s.Addr + "/v1/sys/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vault not ready after %v: %v", limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// healthClient trusts the dev CA (with TLS); until the server has written
// the CA file, requests fail and the probe keeps polling.
func (s *Server) healthClient() *http.Client {
	if s.CACert == "" {
		return http.DefaultClient
	}
	pem, err := os.ReadFile(s.CACert)
	if err != nil {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// Stop stops the server (idempotent): a test may stop Vault midway to see
// the gateway degrade.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGCONT) // a paused server cannot handle SIGTERM
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// Pause freezes the server (SIGSTOP): requests hang as with a Vault that
// stopped answering, until Resume. (Stopping a dev server would lose its
// in-memory data; pausing keeps it, so recovery can be tested.)
func (s *Server) Pause() {
	s.cmd.Process.Signal(syscall.SIGSTOP)
	// The signal is delivered asynchronously: wait until the process is
	// seen stopped ("T" in /proc/<pid>/stat), for at most a few seconds.
	stat := fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid)
	for range 500 {
		b, err := os.ReadFile(stat)
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Write writes data at path with the root token.
func (s *Server) Write(ctx context.Context, path string, data map[string]any) error {
	_, err := s.Client.Logical().WriteWithContext(ctx, path, data)
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// AppRole is the login deploy/vault/setup.sh made for the gateway.
type AppRole struct {
	RoleID       string
	SecretID     string // also in SecretIDFile, as the daemon reads it
	SecretIDFile string
}

// SetUpAppRole runs the shipped deploy/vault/setup.sh approle against s
// (the policy, the mounts, the role), with its files under dir.
func (s *Server) SetUpAppRole(t testing.TB, dir string) AppRole {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "vault", "setup.sh")
	setup := exec.Command("bash", script, "approle", dir)
	setup.Env = append(os.Environ(), "VAULT_ADDR="+s.Addr, "VAULT_TOKEN="+s.Token,
		"PATH="+filepath.Dir(Binary())+string(os.PathListSeparator)+os.Getenv("PATH"))
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("setup.sh: %v\n%s", err, out)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	return AppRole{RoleID: read("role_id"), SecretID: read("secret_id"), SecretIDFile: filepath.Join(dir, "secret_id")}
}
