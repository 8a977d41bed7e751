package gateway_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/xts"
	"google.golang.org/grpc/codes"

	"github.com/nvmegate/nvmegate/cryptdev"
	"github.com/nvmegate/nvmegate/fabric/nvmet"
	"github.com/nvmegate/nvmegate/gateway"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/targetagent"
)

// keyCrypt stands in for cryptsetup (no device-mapper here; the VM tier
// runs the real one): it keeps each open mapping's key.
type keyCrypt struct {
	mu   sync.Mutex
	keys map[string][]byte
}

func (c *keyCrypt) Open(name, device string, key []byte) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[string][]byte{}
	}
	if _, ok := c.keys[name]; !ok {
		c.keys[name] = bytes.Clone(key)
	}
	return "/dev/mapper/" + name, nil
}

func (c *keyCrypt) Close(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.keys, name)
	return nil
}

func (c *keyCrypt) List() ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.keys {
		out = append(out, n)
	}
	return out, nil
}

func (c *keyCrypt) key() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range c.keys {
		return bytes.Clone(k)
	}
	return nil
}

// fileDevices runs re-encryptions on files standing in for the block
// devices under /dev the inventory names.
type fileDevices struct {
	r   *cryptdev.Runner
	dir string
}

func (f fileDevices) path(dev string) string { return filepath.Join(f.dir, filepath.Base(dev)) }
func (f fileDevices) Check(name, dev string, key []byte) error {
	return f.r.Check(name, f.path(dev), key)
}
func (f fileDevices) Start(j cryptdev.Job) { j.Device = f.path(j.Device); f.r.Start(j) }

// xtsFile encrypts (or decrypts) a file in place as dm-crypt's
// aes-xts-plain64 with data key k.
func xtsFile(t *testing.T, path string, k []byte, decrypt bool) []byte {
	t.Helper()
	xk, err := cryptdev.XTSKey(k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := xts.NewCipher(aes.NewCipher, xk)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+512 <= len(b); i += 512 {
		if decrypt {
			c.Decrypt(b[i:i+512], b[i:i+512], uint64(i/512))
		} else {
			c.Encrypt(b[i:i+512], b[i:i+512], uint64(i/512))
		}
	}
	return b
}

// A data-key rotation end to end over a remote target agent: the
// namespace is re-encrypted from the old data key to the new one and
// exported again under it; the old key reads nothing; the report is taken
// once, from the target's own agent on its live stream, for the rotation
// under way only. Another target's agent, streaming all along, receives
// no data key and no namespace of the first.
func TestReencryptEndToEnd(t *testing.T) {
	var skew atomic.Int64 // the gateway's clock runs ahead by this
	g := startGateway(t, func(c *gateway.Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	ctx := ctxT(t)
	inv := pb.NewInventoryClient(g.client(t, admin))
	other := validTarget()
	other.Id = "stor-eu-2"
	otherSub := validSubsystem()
	otherSub.Nqn, otherSub.TargetId = subNQN+"-other", other.Id
	ns := validNamespace()
	ns.BackingDevice = "/dev/nvmegate-test0"
	ns.DataClass = "restricted" // reencrypt_every 8760h
	for _, err := range []error{
		func() error { _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: validTarget()}); return err }(),
		func() error { _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: other}); return err }(),
		func() error {
			_, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: validSubsystem()})
			return err
		}(),
		func() error {
			_, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: otherSub})
			return err
		}(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	plain := make([]byte, 64*1024)
	rand.Read(plain)
	dev := filepath.Join(dir, "nvmegate-test0")
	if err := os.WriteFile(dev, plain, 0o600); err != nil {
		t.Fatal(err)
	}

	crypt := &keyCrypt{}
	runner := &cryptdev.Runner{Rekey: &cryptdev.Rekey{Dir: filepath.Join(dir, "reencrypt"), ChunkSize: 8192}}
	g.remote.Store("stor-eu-1", true)
	r := &targetagent.Remote{Conn: g.client(t, "/target/stor-eu-1"),
		Driver: &nvmet.Driver{Root: filepath.Join(dir, "configfs"), Crypt: crypt, Reencrypt: fileDevices{r: runner, dir: dir}}}
	reports := make(chan error, 10)
	runner.Done = func(j cryptdev.Job, err error) {
		reports <- r.Reencrypted(context.Background(), j.Subsystem, j.NSID, j.Generation, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(rctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	otherSeen := &recordingDriver{}
	waitApplied(t, startRemote(t, g, "stor-eu-2", otherSeen))

	if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	// An added namespace reaches its target at the next programming run
	// (the daemon's reconcile, or a connect): run them until it is there
	// (the agent may still be attaching).
	waitFor(t, "the namespace mapped", func() bool {
		_ = g.agent.Program(ctx, "stor-eu-1")
		return crypt.key() != nil
	})
	k1 := crypt.key()
	// The "device" now holds what dm-crypt would have written through the
	// mapping keyed with k1.
	if err := os.WriteFile(dev, xtsFile(t, dev, k1, false), 0o600); err != nil {
		t.Fatal(err)
	}

	kc := pb.NewKeysClient(g.client(t, admin))
	resp, err := kc.Rotate(ctx, &pb.RotateRequest{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: subNQN, Nsid: 1, Reencrypt: true, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status.ReencryptingTo != 2 || resp.Status.DataKeyGeneration != 1 {
		t.Fatalf("status after the start: %v", resp.Status)
	}
	select {
	case err := <-reports:
		if err != nil {
			t.Fatalf("the report was refused: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no re-encryption report")
	}
	waitFor(t, "the namespace mapped under the new key", func() bool {
		k := crypt.key()
		return k != nil && !bytes.Equal(k, k1)
	})
	k2 := crypt.key()
	if !bytes.Equal(xtsFile(t, dev, k2, true), plain) {
		t.Fatal("the device does not read back under the new data key")
	}
	if bytes.Equal(xtsFile(t, dev, k1, true), plain) {
		t.Fatal("the device still reads under the old data key")
	}
	st, err := kc.Status(ctx, &pb.KeysStatusRequest{SubsystemNqn: subNQN, Kind: pb.KeyKind_KEY_KIND_DATA_KEY})
	if err != nil || len(st.Keys) != 1 || st.Keys[0].DataKeyGeneration != 2 || st.Keys[0].ReencryptingTo != 0 {
		t.Fatalf("status after the commit: %v %v", st, err)
	}
	var committed bool
	for _, e := range queryAll(t, pb.NewAuditClient(g.client(t, auditor)), &pb.QueryRequest{Kinds: []string{"key_rotation"}}) {
		committed = committed || strings.Contains(e.Detail, "re-encrypted to v2")
	}
	if !committed {
		t.Error("the commit is not in the audit log")
	}

	// Reports on the live stream: a generation not under way, another
	// target's namespace, a namespace that does not exist.
	wantCode(t, r.Reencrypted(ctx, subNQN, 1, 3, nil), codes.FailedPrecondition)
	wantCode(t, r.Reencrypted(ctx, otherSub.Nqn, 1, 2, nil), codes.NotFound)
	wantCode(t, r.Reencrypted(ctx, subNQN, 9, 2, nil), codes.NotFound)
	// A repeated report of the committed generation changes nothing.
	if err := r.Reencrypted(ctx, subNQN, 1, 2, nil); err != nil {
		t.Errorf("a repeated report: %v", err)
	}
	if k := crypt.key(); !bytes.Equal(k, k2) {
		t.Error("a repeated report changed the key")
	}

	// The class's reencrypt_every: nothing is due while the data key is
	// young; a year on, the attestation names it and the schedule
	// rotates it (once), to generation 3.
	if started, waiting, err := g.srv.ReencryptDue(ctx); started != 0 || waiting != 0 || err != nil {
		t.Fatalf("a young data key: %d begun, %d waiting, %v", started, waiting, err)
	}
	skew.Store(int64(8761 * time.Hour))
	a, err := g.srv.AttestCompliance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(a.Predicate.OutOfCompliance, "\n"), "data key generation 2 is") {
		t.Errorf("the attestation does not name the late data key: %v", a.Predicate.OutOfCompliance)
	}
	if started, _, err := g.srv.ReencryptDue(ctx); started != 1 || err != nil {
		t.Fatalf("a data key past its period: %d begun, %v", started, err)
	}
	if started, _, err := g.srv.ReencryptDue(ctx); started != 0 || err != nil {
		t.Fatalf("a second check while it runs: %d begun, %v", started, err)
	}
	select {
	case err := <-reports:
		if err != nil {
			t.Fatalf("the scheduled report was refused: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no report of the scheduled re-encryption")
	}
	waitFor(t, "the namespace under generation 3", func() bool {
		k := crypt.key()
		return k != nil && !bytes.Equal(k, k2)
	})
	if !bytes.Equal(xtsFile(t, dev, crypt.key(), true), plain) {
		t.Fatal("the device does not read back after the scheduled rotation")
	}

	_ = g.agent.Program(ctx, "stor-eu-2")
	otherSeen.mu.Lock()
	defer otherSeen.mu.Unlock()
	if len(otherSeen.whole) == 0 {
		t.Fatal("the other target's agent received no state")
	}
	for _, st := range otherSeen.whole {
		for _, sub := range st.Subsystems {
			if sub.NQN != otherSub.Nqn {
				t.Errorf("the other target's agent received subsystem %s", sub.NQN)
			}
			for _, n := range sub.Namespaces {
				if n.DataKey != nil || n.NextDataKey != nil || n.BackingDevice != "" {
					t.Errorf("the other target's agent received %v of %s", n, sub.NQN)
				}
			}
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}
