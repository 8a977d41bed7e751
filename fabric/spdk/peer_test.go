package spdk_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// peer is a stand-in for SPDK's nvmf_tgt JSON-RPC server (SPDK cannot run
// here): it speaks JSON-RPC 2.0 over a Unix socket, accepts only the
// methods and parameter names of SPDK's published RPC schema
// (scripts/rpc.py, python/spdk/rpc: keyring_*, nvmf_*), and enforces what
// SPDK enforces and the driver relies on: key files absolute and not
// readable by group or others, key names registered before use, a
// controller key only with a host key, no DH-HMAC-CHAP with a PSK, hosts
// added once.
type peer struct {
	mu      sync.Mutex
	subs    map[string]map[string]map[string]string // subsystem → host → params given
	keyring map[string]string                       // name → path
	bdevs   map[string]string                       // subsystem/nsid → bdev
	qos     map[string][2]float64                   // bdev → (IOPS, MB/s)
	calls   []string                                // methods called, in order
	ln      net.Listener
}

type field struct {
	required bool
	number   bool
}

var schema = map[string]map[string]field{
	"nvmf_get_subsystems":        {"tgt_name": {}},
	"keyring_get_keys":           {},
	"keyring_file_add_key":       {"name": {required: true}, "path": {required: true}},
	"keyring_file_remove_key":    {"name": {required: true}},
	"nvmf_subsystem_add_host":    {"nqn": {required: true}, "host": {required: true}, "tgt_name": {}, "psk": {}, "dhchap_key": {}, "dhchap_ctrlr_key": {}},
	"nvmf_subsystem_set_keys":    {"nqn": {required: true}, "host": {required: true}, "tgt_name": {}, "dhchap_key": {}, "dhchap_ctrlr_key": {}},
	"nvmf_subsystem_remove_host": {"nqn": {required: true}, "host": {required: true}, "tgt_name": {}},
	"bdev_set_qos_limit": {"name": {required: true}, "rw_ios_per_sec": {number: true}, "rw_mbytes_per_sec": {number: true},
		"r_mbytes_per_sec": {number: true}, "w_mbytes_per_sec": {number: true}},
}

func startPeer(t *testing.T, subsystems ...string) (*peer, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "spdk.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{subs: map[string]map[string]map[string]string{}, keyring: map[string]string{}, ln: ln,
		bdevs: map[string]string{}, qos: map[string][2]float64{}}
	for i, s := range subsystems {
		p.subs[s] = map[string]map[string]string{}
		p.bdevs[s+"/1"] = fmt.Sprintf("Nvme%dn1", i)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p, sock
}

type rpcErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (p *peer) serve(c net.Conn) {
	defer c.Close()
	dec := json.NewDecoder(bufio.NewReader(c))
	for {
		var req struct {
			JSONRPC string         `json:"jsonrpc"`
			ID      int            `json:"id"`
			Method  string         `json:"method"`
			Params  map[string]any `json:"params"`
		}
		if err := dec.Decode(&req); err != nil {
			return
		}
		result, e := p.handle(req.JSONRPC, req.Method, req.Params)
		resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
		if e != nil {
			resp["error"] = e
		} else {
			resp["result"] = result
		}
		b, _ := json.Marshal(resp)
		c.Write(b)
	}
}

func (p *peer) handle(version, method string, raw map[string]any) (any, *rpcErr) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, method)
	if version != "2.0" {
		return nil, &rpcErr{-32600, "Invalid request"}
	}
	fields, ok := schema[method]
	if !ok {
		return nil, &rpcErr{-32601, "Method not found"}
	}
	params := map[string]string{}
	nums := map[string]float64{}
	for k, v := range raw {
		f, ok := fields[k]
		if !ok {
			return nil, &rpcErr{-32602, "Invalid parameters: unknown " + k}
		}
		switch x := v.(type) {
		case string:
			if f.number {
				return nil, &rpcErr{-32602, "Invalid parameters: " + k + " must be a number"}
			}
			params[k] = x
		case float64:
			if !f.number {
				return nil, &rpcErr{-32602, "Invalid parameters: " + k + " must be a string"}
			}
			nums[k] = x
			params[k] = fmt.Sprint(x)
		default:
			return nil, &rpcErr{-32602, "Invalid parameters: " + k}
		}
	}
	for k, f := range fields {
		if f.required && params[k] == "" {
			return nil, &rpcErr{-32602, "Invalid parameters: missing " + k}
		}
	}
	keyOK := func(names ...string) *rpcErr {
		for _, n := range names {
			if n != "" && p.keyring[n] == "" {
				return &rpcErr{-19, "Could not find key " + n}
			}
		}
		return nil
	}
	switch method {
	case "nvmf_get_subsystems":
		var out []map[string]any
		for nqn, hosts := range p.subs {
			var hs []map[string]string
			for h := range hosts {
				hs = append(hs, map[string]string{"nqn": h})
			}
			var nss []map[string]any
			for key, bdev := range p.bdevs {
				if len(key) > len(nqn) && key[:len(nqn)] == nqn && key[len(nqn)] == '/' {
					nss = append(nss, map[string]any{"nsid": 1, "bdev_name": bdev})
				}
			}
			out = append(out, map[string]any{"nqn": nqn, "allow_any_host": false, "hosts": hs, "namespaces": nss})
		}
		return out, nil
	case "keyring_get_keys":
		var out []map[string]any
		for n, path := range p.keyring {
			out = append(out, map[string]any{"name": n, "path": path, "module": "keyring_file", "removed": false})
		}
		return out, nil
	case "bdev_set_qos_limit":
		found := false
		for _, b := range p.bdevs {
			found = found || b == params["name"]
		}
		if !found {
			return nil, &rpcErr{-19, "No such bdev"}
		}
		p.qos[params["name"]] = [2]float64{nums["rw_ios_per_sec"], nums["rw_mbytes_per_sec"]}
		return true, nil
	case "keyring_file_add_key":
		path := params["path"]
		if !filepath.IsAbs(path) {
			return nil, &rpcErr{-22, "Non-absolute paths are not allowed"}
		}
		fi, err := os.Stat(path)
		if err != nil {
			return nil, &rpcErr{-2, "Could not stat key file"}
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, &rpcErr{-1, fmt.Sprintf("Invalid permissions for key file: %04o", fi.Mode().Perm())}
		}
		if p.keyring[params["name"]] != "" {
			return nil, &rpcErr{-17, "Key already exists"}
		}
		p.keyring[params["name"]] = path
		return true, nil
	case "keyring_file_remove_key":
		n := params["name"]
		if p.keyring[n] == "" {
			return nil, &rpcErr{-19, "No such key"}
		}
		for _, hosts := range p.subs {
			for _, hp := range hosts {
				if hp["dhchap_key"] == n || hp["dhchap_ctrlr_key"] == n || hp["psk"] == n {
					return nil, &rpcErr{-16, "Key in use"} // stricter than SPDK: catches driver ordering bugs
				}
			}
		}
		delete(p.keyring, n)
		return true, nil
	case "nvmf_subsystem_add_host", "nvmf_subsystem_set_keys", "nvmf_subsystem_remove_host":
		hosts, ok := p.subs[params["nqn"]]
		if !ok {
			return nil, &rpcErr{-32602, "Invalid parameters: no such subsystem"}
		}
		h := params["host"]
		switch method {
		case "nvmf_subsystem_add_host":
			if hosts[h] != nil {
				return nil, &rpcErr{-32602, "Host already exists"}
			}
			if params["dhchap_ctrlr_key"] != "" && params["dhchap_key"] == "" {
				return nil, &rpcErr{-32602, "dhchap_ctrlr_key requires dhchap_key"}
			}
			if params["psk"] != "" && params["dhchap_key"] != "" {
				return nil, &rpcErr{-32602, "in-band authentication with a secure channel is not supported"}
			}
			if e := keyOK(params["dhchap_key"], params["dhchap_ctrlr_key"], params["psk"]); e != nil {
				return nil, e
			}
			hosts[h] = params
		case "nvmf_subsystem_set_keys":
			if hosts[h] == nil {
				return nil, &rpcErr{-19, "No such host"}
			}
			if e := keyOK(params["dhchap_key"], params["dhchap_ctrlr_key"]); e != nil {
				return nil, e
			}
			for _, k := range []string{"dhchap_key", "dhchap_ctrlr_key"} { // a key not given is cleared
				if params[k] != "" {
					hosts[h][k] = params[k]
				} else {
					delete(hosts[h], k)
				}
			}
		default:
			if hosts[h] == nil {
				return nil, &rpcErr{-19, "No such host"}
			}
			delete(hosts, h)
		}
		return true, nil
	}
	return nil, &rpcErr{-32601, "Method not found"}
}

func (p *peer) qosOf(bdev string) [2]float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qos[bdev]
}

func (p *peer) snapshot() (map[string]map[string]map[string]string, map[string]string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	subs := map[string]map[string]map[string]string{}
	for s, hs := range p.subs {
		subs[s] = map[string]map[string]string{}
		for h, v := range hs {
			c := map[string]string{}
			for k, x := range v {
				c[k] = x
			}
			subs[s][h] = c
		}
	}
	kr := map[string]string{}
	for k, v := range p.keyring {
		kr[k] = v
	}
	calls := append([]string(nil), p.calls...)
	p.calls = nil
	return subs, kr, calls
}
