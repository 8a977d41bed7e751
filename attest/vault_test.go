package attest_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nvmegate/nvmegate/attest"
)

// fakeTransit is a stand-in for Vault's Transit engine (read key, sign),
// with real keys and real signatures: a Vault server cannot be installed
// on these machines. It speaks the HTTP API that sigstore's hashivault
// provider and the Vault client use.
type fakeTransit struct {
	mu    sync.Mutex
	typ   string // "ed25519" or "ecdsa-p256"
	keys  []any  // version i+1: ed25519.PrivateKey or *ecdsa.PrivateKey
	token string
	signs []string // key versions asked for
}

func (f *fakeTransit) rotate() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.typ == "ed25519" {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		f.keys = append(f.keys, k)
	} else {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		f.keys = append(f.keys, k)
	}
}

func (f *fakeTransit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("X-Vault-Token") != f.token {
		http.Error(w, `{"errors":["permission denied"]}`, http.StatusForbidden)
		return
	}
	reply := func(data map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"data": data})
	}
	switch p := r.URL.Path; {
	case r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/transit/keys/"):
		keys := map[string]any{}
		for i, k := range f.keys {
			var pub string
			switch k := k.(type) {
			case ed25519.PrivateKey:
				pub = base64.StdEncoding.EncodeToString(k.Public().(ed25519.PublicKey))
			case *ecdsa.PrivateKey:
				der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
				pub = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
			}
			keys[strconv.Itoa(i+1)] = map[string]any{"public_key": pub, "name": f.typ}
		}
		reply(map[string]any{"type": f.typ, "latest_version": len(f.keys), "keys": keys})
	case (r.Method == http.MethodPut || r.Method == http.MethodPost) && strings.HasPrefix(p, "/v1/transit/sign/"):
		var req struct {
			Input      string `json:"input"`
			Prehashed  bool   `json:"prehashed"`
			KeyVersion string `json:"key_version"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		f.signs = append(f.signs, req.KeyVersion)
		v, _ := strconv.Atoi(req.KeyVersion)
		if v == 0 {
			v = len(f.keys)
		}
		if v < 1 || v > len(f.keys) {
			http.Error(w, `{"errors":["no such version"]}`, http.StatusBadRequest)
			return
		}
		in, _ := base64.StdEncoding.DecodeString(req.Input)
		var sig []byte
		switch k := f.keys[v-1].(type) {
		case ed25519.PrivateKey:
			sig = ed25519.Sign(k, in)
		case *ecdsa.PrivateKey:
			if !req.Prehashed {
				http.Error(w, `{"errors":["want prehashed"]}`, http.StatusBadRequest)
				return
			}
			sig, _ = ecdsa.SignASN1(rand.Reader, k, in)
		}
		reply(map[string]any{"signature": "vault:v" + strconv.Itoa(v) + ":" + base64.StdEncoding.EncodeToString(sig)})
	default:
		http.NotFound(w, r)
	}
}

func TestVaultSigner(t *testing.T) {
	for _, typ := range []string{"ed25519", "ecdsa-p256"} {
		t.Run(typ, func(t *testing.T) {
			ctx := context.Background()
			ft := &fakeTransit{typ: typ, token: "s.test"}
			ft.rotate()
			srv := httptest.NewServer(ft)
			defer srv.Close()
			s, err := attest.NewVaultSigner(ctx, attest.VaultConfig{Address: srv.URL, Token: "s.test", Key: "audit-log"})
			if err != nil {
				t.Fatal(err)
			}
			msg := []byte("origin\n1\nAAAA\n")
			sig, err := s.Sign(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			v1 := s.PublicKey()
			if v1.Version != 1 || v1.Verify(msg, sig) != nil {
				t.Fatalf("v1 signature: %v", v1)
			}
			// Rotation in Vault: the signer keeps signing with its pinned
			// version until Refresh, and then reports the new one.
			ft.rotate()
			sig, err = s.Sign(ctx, msg)
			if err != nil || s.PublicKey().Version != 1 || v1.Verify(msg, sig) != nil {
				t.Fatalf("after rotation, before refresh: %v", err)
			}
			if err := s.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			sig, err = s.Sign(ctx, msg)
			v2 := s.PublicKey()
			if err != nil || v2.Version != 2 || v2.Verify(msg, sig) != nil || v2.Equal(v1) {
				t.Fatalf("after refresh: %v %v", v2, err)
			}
			all := s.PublicKeys()
			if len(all) != 2 || !all[0].Equal(v1) || !all[1].Equal(v2) {
				t.Fatalf("PublicKeys %v", all)
			}
			if got := strings.Join(ft.signs, ","); got != "1,1,2" {
				t.Fatalf("versions asked of Vault: %s", got)
			}
			// A note signed through the adapter verifies offline.
			ns, err := attest.NoteSigner(ctx, s, "log.example/a")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ns.Sign(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := attest.NewVaultSigner(ctx, attest.VaultConfig{Address: srv.URL, Token: "wrong", Key: "audit-log"}); err == nil {
				t.Fatal("wrong token accepted")
			}
		})
	}
}
