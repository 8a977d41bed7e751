package spdk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nvmegate/nvmegate/fabric"
)

// KeyPrefix starts the keyring names the driver owns.
const KeyPrefix = "nvmegate-"

// Driver programs one SPDK target.
type Driver struct {
	Socket  string // the JSON-RPC Unix socket, e.g. /var/tmp/spdk.sock
	KeyDir  string // where key files are written (absolute; 0700)
	TgtName string // nvmf target name; "" for the default
	Timeout time.Duration

	mu      sync.Mutex
	applied map[string]hostKeys  // subsystem NQN + "\x00" + host NQN → the key names it was given
	qos     map[string][2]uint64 // bdev → the caps last set
	// subs are the subsystems of the whole state last applied, nil if none
	// was or an application failed since: a delta is taken only on top of
	// a state applied whole. keys are the keyring names of ours registered
	// (known after a whole state).
	subs map[string]bool
	keys map[string]bool
}

// hostKeys are the keyring names of one host on one subsystem.
type hostKeys struct{ DHCHAP, Ctrl, PSK string }

// RPCError is an error object of a JSON-RPC reply.
type RPCError struct {
	Method  string
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("spdk: %s: error %d: %s", e.Method, e.Code, e.Message)
}

// client is one JSON-RPC connection.
type client struct {
	conn net.Conn
	dec  *json.Decoder
	id   int
}

func (d *Driver) dial(ctx context.Context) (*client, error) {
	var dl net.Dialer
	conn, err := dl.DialContext(ctx, "unix", d.Socket)
	if err != nil {
		return nil, fmt.Errorf("spdk: %w", err)
	}
	t := d.Timeout
	if t == 0 {
		t = 10 * time.Second
	}
	conn.SetDeadline(time.Now().Add(t))
	return &client{conn: conn, dec: json.NewDecoder(conn)}, nil
}

// call sends one request and decodes its result into out (if not nil).
// Errors never contain params: they may hold key paths, never secrets,
// but the rule is simpler kept absolute.
func (c *client) call(method string, params, out any) error {
	c.id++
	req := map[string]any{"jsonrpc": "2.0", "id": c.id, "method": method}
	if params != nil {
		req["params"] = params
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := c.conn.Write(b); err != nil {
		return fmt.Errorf("spdk: %s: %w", method, err)
	}
	var resp struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	if err := c.dec.Decode(&resp); err != nil {
		return fmt.Errorf("spdk: %s: reply: %w", method, err)
	}
	if resp.Error != nil {
		resp.Error.Method = method
		return resp.Error
	}
	if resp.ID != c.id {
		return fmt.Errorf("spdk: %s: reply id %d, want %d", method, resp.ID, c.id)
	}
	if out != nil {
		return json.Unmarshal(resp.Result, out)
	}
	return nil
}

// keyName is the content-derived keyring name of one secret.
func keyName(sub, host, kind, secret string) string {
	h := sha256.Sum256([]byte(sub + "\x00" + host + "\x00" + kind + "\x00" + secret))
	return KeyPrefix + kind + "-" + hex.EncodeToString(h[:12])
}

// Apply makes the target's hosts and keys match s: what can be checked is
// checked before any call, hosts no longer allowed are removed before any
// is added, and a namespace to encrypt at rest — which this driver does
// not export yet (SPDK's crypto bdev would be the way) — is reported in a
// *fabric.NotServedError once the rest is applied, never served in the
// clear by nvmegate: one namespace must not hold back every tenant's
// hosts on the target.
func (d *Driver) Apply(ctx context.Context, s fabric.State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.applied == nil {
		d.applied = map[string]hostKeys{}
	}
	if !filepath.IsAbs(d.KeyDir) {
		return errors.New("spdk: KeyDir must be an absolute path (keyring_file_add_key requires one)")
	}
	for _, sub := range s.Subsystems {
		for _, h := range sub.Hosts {
			if err := checkHost(h, sub.NQN); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(d.KeyDir, 0o700); err != nil {
		return fmt.Errorf("spdk: %w", err)
	}
	c, err := d.dial(ctx)
	if err != nil {
		return err
	}
	defer c.conn.Close()

	var subs []struct {
		NQN   string `json:"nqn"`
		Hosts []struct {
			NQN string `json:"nqn"`
		} `json:"hosts"`
		Namespaces []struct {
			NSID     uint32 `json:"nsid"`
			BdevName string `json:"bdev_name"`
		} `json:"namespaces"`
	}
	var p map[string]any
	if d.TgtName != "" {
		p = map[string]any{"tgt_name": d.TgtName}
	}
	if err := c.call("nvmf_get_subsystems", p, &subs); err != nil {
		return err
	}
	present := map[string]map[string]bool{}
	bdevs := map[string]string{} // subsystem NQN + "/" + NSID → bdev
	for _, sub := range subs {
		for _, n := range sub.Namespaces {
			bdevs[fmt.Sprintf("%s/%d", sub.NQN, n.NSID)] = n.BdevName
		}
		present[sub.NQN] = map[string]bool{}
		for _, h := range sub.Hosts {
			present[sub.NQN][h.NQN] = true
		}
	}
	var keyring []struct {
		Name string `json:"name"`
	}
	if err := c.call("keyring_get_keys", nil, &keyring); err != nil {
		return err
	}
	registered := map[string]bool{}
	for _, k := range keyring {
		registered[k.Name] = true
	}

	d.subs = nil
	for _, sub := range s.Subsystems {
		if _, ok := present[sub.NQN]; !ok {
			return fmt.Errorf("spdk: subsystem %s does not exist on the target (the operator creates subsystems)", sub.NQN)
		}
	}
	// Removals first, on every subsystem: nothing after can hold them back.
	for _, sub := range s.Subsystems {
		want := map[string]bool{}
		for _, h := range sub.Hosts {
			want[h.NQN] = true
		}
		for h := range present[sub.NQN] {
			if !want[h] {
				if err := c.call("nvmf_subsystem_remove_host", d.params("nqn", sub.NQN, "host", h), nil); err != nil {
					return err
				}
				delete(d.applied, sub.NQN+"\x00"+h)
			}
		}
	}
	used := map[string]bool{}
	var notServed []fabric.NotServed
	for _, sub := range s.Subsystems {
		hosts := present[sub.NQN]
		for _, h := range sub.Hosts {
			k, err := d.registerKeys(c, sub.NQN, h, registered)
			if err != nil {
				return err
			}
			for _, n := range []string{k.DHCHAP, k.Ctrl, k.PSK} {
				used[n] = true
			}
			if err := d.admit(c, sub.NQN, h.NQN, k, hosts[h.NQN]); err != nil {
				return err
			}
		}
		for _, n := range sub.Namespaces {
			bdev := bdevs[fmt.Sprintf("%s/%d", sub.NQN, n.NSID)]
			if n.BackingDevice != "" {
				why := "to be encrypted at rest, which this driver does not do yet; not exported by nvmegate"
				if bdev != "" {
					// The operator's, as every SPDK namespace is: say
					// that it is served, and not encrypted by nvmegate.
					why = fmt.Sprintf("to be encrypted at rest, which this driver does not do yet; the target serves it from the operator's bdev %s, not encrypted by nvmegate", bdev)
				}
				notServed = append(notServed, fabric.NotServed{Subsystem: sub.NQN, NSID: n.NSID, Reason: why})
				continue
			}
			if err := d.setQoS(c, bdev, n); err != nil {
				return err
			}
		}
	}
	// Keys of ours nothing refers to any more.
	d.keys = map[string]bool{}
	for name := range registered {
		if !strings.HasPrefix(name, KeyPrefix) {
			continue
		}
		d.keys[name] = true
		if !used[name] {
			if err := d.removeKey(c, name); err != nil {
				return err
			}
		}
	}
	d.subs = map[string]bool{}
	for _, sub := range s.Subsystems {
		d.subs[sub.NQN] = true
	}
	if len(notServed) > 0 {
		return &fabric.NotServedError{Namespaces: notServed}
	}
	return nil
}

// ApplyDelta applies a change of host entries to the state last applied
// whole, with the RPCs of those hosts only: their keys registered
// (keyring_file_add_key), the host added, re-keyed or removed and added
// again (see admit) or removed (nvmf_subsystem_remove_host), and the keys
// they no longer use unregistered and deleted. Nothing is listed: the
// driver knows the key names it gave each host.
//
// It refuses with fabric.ErrNeedFull, calling nothing, before a whole state
// was applied, after an application failed, and for a subsystem the
// applied state does not have (an inventory change comes as a whole
// state); what SPDK cannot do is refused as Apply refuses it.
func (d *Driver) ApplyDelta(ctx context.Context, dl fabric.Delta) (err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	subs := d.subs
	if subs == nil {
		return fmt.Errorf("spdk: no whole state applied: %w", fabric.ErrNeedFull)
	}
	for _, ch := range dl.Hosts {
		if !subs[ch.Subsystem] {
			return fmt.Errorf("spdk: subsystem %s is not in the applied state: %w", ch.Subsystem, fabric.ErrNeedFull)
		}
		if !ch.Remove {
			if err := checkHost(ch.Host, ch.Subsystem); err != nil {
				return err
			}
		}
	}
	if len(dl.Hosts) == 0 {
		return nil
	}
	c, err := d.dial(ctx)
	if err != nil {
		return err
	}
	defer c.conn.Close()
	d.subs = nil // until the delta is applied whole
	defer func() {
		if err == nil {
			d.subs = subs
		}
	}()
	for _, ch := range dl.Hosts {
		id := ch.Subsystem + "\x00" + ch.Host.NQN
		prev, known := d.applied[id]
		var k hostKeys
		if ch.Remove {
			if known {
				if err := c.call("nvmf_subsystem_remove_host", d.params("nqn", ch.Subsystem, "host", ch.Host.NQN), nil); err != nil {
					return err
				}
				delete(d.applied, id)
			}
		} else {
			if k, err = d.registerKeys(c, ch.Subsystem, ch.Host, d.keys); err != nil {
				return err
			}
			if err := d.admit(c, ch.Subsystem, ch.Host.NQN, k, known); err != nil {
				return err
			}
		}
		// A key name is the host's on this subsystem alone (keyName):
		// one it no longer uses is no one's.
		for _, name := range []string{prev.DHCHAP, prev.Ctrl, prev.PSK} {
			if name != "" && name != k.DHCHAP && name != k.Ctrl && name != k.PSK && d.keys[name] {
				if err := d.removeKey(c, name); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// checkHost refuses what SPDK cannot do.
func checkHost(h fabric.Host, sub string) error {
	if h.TLSPSK != "" && (h.DHCHAPKey != "" || h.DHCHAPCtrlKey != "") {
		return fmt.Errorf("spdk: host %s on %s: SPDK does not combine in-band authentication with a secure channel", h.NQN, sub)
	}
	return nil
}

// registerKeys names h's secrets on sub and registers those registered
// does not hold (adding them to it).
func (d *Driver) registerKeys(c *client, sub string, h fabric.Host, registered map[string]bool) (hostKeys, error) {
	k := hostKeys{}
	for _, sec := range []struct {
		kind, value string
		name        *string
	}{{"dhchap", h.DHCHAPKey, &k.DHCHAP}, {"ctrl", h.DHCHAPCtrlKey, &k.Ctrl}, {"psk", h.TLSPSK, &k.PSK}} {
		if sec.value == "" {
			continue
		}
		*sec.name = keyName(sub, h.NQN, sec.kind, sec.value)
		if !registered[*sec.name] {
			if err := d.addKey(c, *sec.name, sec.value); err != nil {
				return hostKeys{}, err
			}
			registered[*sec.name] = true
		}
	}
	return k, nil
}

// removeKey unregisters a key of ours and deletes its file.
func (d *Driver) removeKey(c *client, name string) error {
	if err := c.call("keyring_file_remove_key", map[string]any{"name": name}, nil); err != nil {
		return err
	}
	delete(d.keys, name)
	os.Remove(filepath.Join(d.KeyDir, name))
	return nil
}

// setQoS caps a namespace's bdev with bdev_set_qos_limit (0 lifts a cap),
// once after a start and then when the caps change.
func (d *Driver) setQoS(c *client, bdev string, n fabric.Namespace) error {
	if bdev == "" {
		return nil // a namespace the target does not have: the operator's to add
	}
	if d.qos == nil {
		d.qos = map[string][2]uint64{}
	}
	want := [2]uint64{n.MaxIOPS, n.MaxMBps}
	if cur, known := d.qos[bdev]; known && cur == want {
		return nil
	}
	err := c.call("bdev_set_qos_limit", map[string]any{"name": bdev, "rw_ios_per_sec": n.MaxIOPS, "rw_mbytes_per_sec": n.MaxMBps}, nil)
	if err != nil {
		return err
	}
	d.qos[bdev] = want
	return nil
}

func (d *Driver) params(kv ...string) map[string]any {
	p := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			p[kv[i]] = kv[i+1]
		}
	}
	if d.TgtName != "" {
		p["tgt_name"] = d.TgtName
	}
	return p
}

// addKey writes a secret to its file (0600) and registers it.
func (d *Driver) addKey(c *client, name, secret string) error {
	path := filepath.Join(d.KeyDir, name)
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		return fmt.Errorf("spdk: key file %s: %w", name, err)
	}
	return c.call("keyring_file_add_key", map[string]any{"name": name, "path": path}, nil)
}

// admit adds a host, or re-keys it if its keys changed: DH-HMAC-CHAP keys
// in place, a PSK (or keys this driver did not set) by removing and adding
// the host again.
func (d *Driver) admit(c *client, sub, host string, k hostKeys, present bool) error {
	id := sub + "\x00" + host
	prev, known := d.applied[id]
	add := d.params("nqn", sub, "host", host, "dhchap_key", k.DHCHAP, "dhchap_ctrlr_key", k.Ctrl, "psk", k.PSK)
	switch {
	case !present:
		if err := c.call("nvmf_subsystem_add_host", add, nil); err != nil {
			return err
		}
	case known && prev == k:
		return nil
	case known && prev.PSK == k.PSK && k.PSK == "":
		if err := c.call("nvmf_subsystem_set_keys", d.params("nqn", sub, "host", host, "dhchap_key", k.DHCHAP, "dhchap_ctrlr_key", k.Ctrl), nil); err != nil {
			return err
		}
	default:
		if err := c.call("nvmf_subsystem_remove_host", d.params("nqn", sub, "host", host), nil); err != nil {
			return err
		}
		if err := c.call("nvmf_subsystem_add_host", add, nil); err != nil {
			return err
		}
	}
	d.applied[id] = k
	return nil
}
