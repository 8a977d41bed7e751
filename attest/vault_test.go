package attest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	vault "github.com/hashicorp/vault/api"

	"golang.org/x/mod/sumdb/note"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/internal/vaulttest"
)

// TestVaultSigner signs through a real Vault server's Transit engine (via
// sigstore's hashivault provider), for both key types Transit can sign
// with that offline verifiers accept: the signer pins a key version, keeps
// it across a rotation in Vault until Refresh, and lists every version's
// public key.
func TestVaultSigner(t *testing.T) {
	v := vaulttest.Start(t)
	for _, typ := range []string{"ed25519", "ecdsa-p256"} {
		t.Run(typ, func(t *testing.T) {
			ctx := context.Background()
			key := "audit-log-" + typ
			if err := v.Write(ctx, "transit/keys/"+key, map[string]any{"type": typ}); err != nil {
				t.Fatal(err)
			}
			s, err := attest.NewVaultSigner(ctx, attest.VaultConfig{Address: v.Addr, Token: v.Token, Key: key})
			if err != nil {
				t.Fatal(err)
			}
			msg := []byte("origin\n1\nAAAA\n")
			sig, err := s.Sign(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			v1 := s.PublicKey()
			if v1.Version != 1 || v1.Verify(msg, sig) != nil || string(v1.Algorithm) != typ {
				t.Fatalf("v1: %v", v1)
			}
			// Rotation in Vault: the signer keeps its pinned version until
			// Refresh, then signs with the new one.
			if err := v.Write(ctx, "transit/keys/"+key+"/rotate", nil); err != nil {
				t.Fatal(err)
			}
			sig, err = s.Sign(ctx, msg)
			if err != nil || s.PublicKey().Version != 1 || v1.Verify(msg, sig) != nil {
				t.Fatalf("after rotation, before refresh: %v", err)
			}
			if err := s.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			sig, err = s.Sign(ctx, msg)
			v2 := s.PublicKey()
			if err != nil || v2.Version != 2 || v2.Verify(msg, sig) != nil || v2.Equal(v1) || v1.Verify(msg, sig) == nil {
				t.Fatalf("after refresh: %v %v", v2, err)
			}
			all := s.PublicKeys()
			if len(all) != 2 || !all[0].Equal(v1) || !all[1].Equal(v2) {
				t.Fatalf("PublicKeys %v", all)
			}
			// A note signed through the adapter verifies offline with the
			// exported public key alone.
			ns, err := attest.NoteSigner(ctx, s, "log.example/a")
			if err != nil {
				t.Fatal(err)
			}
			signed, err := note.Sign(&note.Note{Text: string(msg)}, ns)
			if err != nil {
				t.Fatal(err)
			}
			nv, err := v2.NoteVerifier("log.example/a")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := note.Open(signed, note.VerifierList(nv)); err != nil {
				t.Fatalf("offline note verification: %v", err)
			}
		})
	}
	// With a token file, Refresh reads the token again: a replaced token is
	// used, a revoked one fails the refresh (and the signer keeps its pin).
	t.Run("token file", func(t *testing.T) {
		ctx := context.Background()
		tok, err := v.Client.Auth().Token().Create(&vault.TokenCreateRequest{TTL: "1h"})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(f, []byte(tok.Auth.ClientToken+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := attest.NewVaultSigner(ctx, attest.VaultConfig{Address: v.Addr, TokenFile: f, Key: "audit-log-ed25519"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sign(ctx, []byte("m")); err != nil {
			t.Fatal(err)
		}
		tok2, err := v.Client.Auth().Token().Create(&vault.TokenCreateRequest{TTL: "1h"})
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Client.Auth().Token().RevokeTree(tok.Auth.ClientToken); err != nil {
			t.Fatal(err)
		}
		if err := s.Refresh(ctx); err == nil {
			t.Fatal("refresh with a revoked token succeeded")
		}
		if err := os.WriteFile(f, []byte(tok2.Auth.ClientToken), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := s.Refresh(ctx); err != nil {
			t.Fatalf("refresh with the replaced token: %v", err)
		}
		if _, err := s.Sign(ctx, []byte("m")); err != nil {
			t.Fatalf("sign with the replaced token: %v", err)
		}
	})
	// A Vault that stops answering holds a signature no longer than the
	// caller's context (the checkpointer's shutdown bound).
	t.Run("hung vault", func(t *testing.T) {
		s, err := attest.NewVaultSigner(context.Background(), attest.VaultConfig{Address: v.Addr, Token: v.Token, Key: "audit-log-ed25519"})
		if err != nil {
			t.Fatal(err)
		}
		v.Pause()
		defer v.Resume()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = s.Sign(ctx, []byte("m"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("sign against a paused Vault: %v", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("sign returned after %v", d)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		ctx := context.Background()
		if err := v.Write(ctx, "transit/keys/hmac-only", map[string]any{"type": "aes256-gcm96"}); err != nil {
			t.Fatal(err)
		}
		for name, cfg := range map[string]attest.VaultConfig{
			"wrong token":       {Address: v.Addr, Token: "wrong", Key: "audit-log-ed25519"},
			"no such key":       {Address: v.Addr, Token: v.Token, Key: "absent"},
			"not a signing key": {Address: v.Addr, Token: v.Token, Key: "hmac-only"},
		} {
			if _, err := attest.NewVaultSigner(ctx, cfg); err == nil {
				t.Errorf("%s: accepted", name)
			} else if strings.Contains(err.Error(), v.Token) {
				t.Errorf("%s: error names the token: %v", name, err)
			}
		}
	})
}
