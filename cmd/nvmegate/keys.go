package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// keysCmd groups the key commands. format, parse and gen work offline: they
// only touch the NVMe key formats, never the gateway.
func (a *app) keysCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "keys", Short: "Key rotation and status (gateway); NVMe key formats (offline)"}
	cmd.AddCommand(a.keysRotateCmd(), a.keysStatusCmd(), a.keysFormatCmd(), a.keysParseCmd(), a.keysGenCmd())
	return cmd
}

func (a *app) keysFormatCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "format", Short: "Encode a secret given in hex as a DHHC-1 or NVMeTLSkey-1 string"}
	var secretHex, hashName string
	dhchap := &cobra.Command{
		Use:   "dhchap",
		Short: "Encode a DH-HMAC-CHAP secret (DHHC-1:hh:...:)",
		Long: `Encode a 32, 48 or 64-byte secret as DHHC-1:hh:<base64(secret || CRC-32)>:.
The string is printed as the last line of stdout. Give --secret - to read the hex
from stdin instead of the command line (where other users can see it).`,
		Example: "  nvmegate keys format dhchap --secret $(openssl rand -hex 32) --hash sha256",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := nvmefmt.ParseHash(hashName)
			if err != nil {
				return fmt.Errorf("--hash: %w", err)
			}
			secret, err := a.readSecretHex(cmd, secretHex)
			if err != nil {
				return err
			}
			defer clear(secret)
			key, err := nvmefmt.EncodeDHCHAP(h, secret)
			if err != nil {
				return err
			}
			return a.printKey(map[string]any{"kind": "dhchap", "hash": h.String(), "length": len(secret), "key": key}, key)
		},
	}
	dhchap.Flags().StringVar(&secretHex, "secret", "", `the secret in hex, or "-" to read it from stdin`)
	dhchap.Flags().StringVar(&hashName, "hash", "none", "transform hash: none, sha256, sha384 or sha512")
	dhchap.MarkFlagRequired("secret")

	var pskHex, pskHash, hostNQN, subNQN string
	var compat bool
	tls := &cobra.Command{
		Use:   "tls-psk",
		Short: "Encode a configured TLS PSK (NVMeTLSkey-1:hh:...:) and derive its identities",
		Long: `Encode a 32-byte (sha256) or 48-byte (sha384) configured PSK in the NVMe/TCP
interchange format. With --hostnqn and --subnqn, also derive the PSK identities
v0 and v1 and the TLS PSK for identity v1 (hex), with the RFC 8446 HkdfLabel
encoding that the kernel and libnvme 1.16 / nvme-cli 2.16 use; --compat gives
the encoding of older libnvme releases.`,
		Example: "  nvmegate keys format tls-psk --secret $(openssl rand -hex 32) --hash sha256 \\\n    --hostnqn nqn.2014-08.org.nvmexpress:uuid:... --subnqn nqn.2026-01.io.example:s1 -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := nvmefmt.ParseHash(pskHash)
			if err != nil {
				return fmt.Errorf("--hash: %w", err)
			}
			if (hostNQN == "") != (subNQN == "") {
				return errors.New("--hostnqn and --subnqn go together")
			}
			psk, err := a.readSecretHex(cmd, pskHex)
			if err != nil {
				return err
			}
			defer clear(psk)
			key, err := nvmefmt.EncodeTLSPSK(h, psk)
			if err != nil {
				return err
			}
			out := map[string]any{"kind": "tls-psk", "hash": h.String(), "length": len(psk), "key": key}
			if hostNQN != "" {
				var opts []nvmefmt.Option
				if compat {
					opts = append(opts, nvmefmt.CompatLabels())
				}
				creds, err := nvmefmt.DeriveTLS(nvmefmt.TLSKey{Hash: h, PSK: psk}, hostNQN, subNQN, opts...)
				if err != nil {
					return err
				}
				out["identity_v0"] = creds.IdentityV0
				out["identity_v1"] = creds.IdentityV1
				out["tls_psk"] = hex.EncodeToString(creds.PSKV1)
				clear(creds.PSKV0)
				clear(creds.PSKV1)
			}
			if a.output == "json" {
				return writeJSON(a.stdout, out)
			}
			for _, k := range []string{"identity_v0", "identity_v1", "tls_psk"} {
				if v, ok := out[k]; ok {
					fmt.Fprintf(a.stdout, "%s: %s\n", k, v)
				}
			}
			_, err = fmt.Fprintln(a.stdout, key)
			return err
		},
	}
	tls.Flags().StringVar(&pskHex, "secret", "", `the configured PSK in hex, or "-" to read it from stdin`)
	tls.Flags().StringVar(&pskHash, "hash", "sha256", "PSK hash: sha256 (32 bytes) or sha384 (48 bytes)")
	tls.Flags().StringVar(&hostNQN, "hostnqn", "", "host NQN, to derive identities")
	tls.Flags().StringVar(&subNQN, "subnqn", "", "subsystem NQN, to derive identities")
	tls.Flags().BoolVar(&compat, "compat", false, "use the label encoding of libnvme before 1.16")
	tls.MarkFlagRequired("secret")
	cmd.AddCommand(dhchap, tls)
	return cmd
}

func (a *app) keysParseCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "parse STRING",
		Short: "Check a DHHC-1 or NVMeTLSkey-1 string and print its kind, hash and length (never the secret)",
		Long: `Check a key string strictly: prefix, hash, base64, length, CRC-32 and the
trailing colon. Prints the kind, hash and secret length; exits non-zero naming
the part that is wrong. Give "-" to read the string from stdin.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := args[0]
			if s == "-" {
				line, err := readLine(cmd.InOrStdin())
				if err != nil {
					return err
				}
				s = line
			}
			var kind string
			var h nvmefmt.Hash
			var n int
			switch {
			case strings.HasPrefix(s, "DHHC-1:"):
				k, err := nvmefmt.ParseDHCHAP(s)
				if err != nil {
					return err
				}
				kind, h, n = "dhchap", k.Hash, len(k.Secret)
				clear(k.Secret)
			case strings.HasPrefix(s, "NVMeTLSkey-1:"):
				k, err := nvmefmt.ParseTLSPSK(s)
				if err != nil {
					return err
				}
				kind, h, n = "tls-psk", k.Hash, len(k.PSK)
				clear(k.PSK)
			default:
				return fmt.Errorf("%w: a key starts with DHHC-1: or NVMeTLSkey-1:", nvmefmt.ErrPrefix)
			}
			if a.output == "json" {
				return writeJSON(a.stdout, map[string]any{"kind": kind, "hash": h.String(), "length": n, "valid": true})
			}
			_, err := fmt.Fprintf(a.stdout, "valid %s key: hash %s, %d-byte secret\n", kind, h, n)
			return err
		},
	}
}

func (a *app) keysGenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "gen", Short: "Generate a new key from crypto/rand"}
	var dhHash string
	var length int
	dhchap := &cobra.Command{
		Use: "dhchap", Short: "Generate a DH-HMAC-CHAP secret", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := nvmefmt.ParseHash(dhHash)
			if err != nil {
				return fmt.Errorf("--hash: %w", err)
			}
			n := length
			if n == 0 {
				if n = h.Size(); n == 0 {
					n = 32
				}
			}
			secret := make([]byte, n)
			defer clear(secret)
			rand.Read(secret)
			key, err := nvmefmt.EncodeDHCHAP(h, secret)
			if err != nil {
				return err
			}
			return a.printKey(map[string]any{"kind": "dhchap", "hash": h.String(), "length": n, "key": key}, key)
		},
	}
	dhchap.Flags().StringVar(&dhHash, "hash", "sha256", "transform hash: none, sha256, sha384 or sha512")
	dhchap.Flags().IntVar(&length, "length", 0, "secret length 32, 48 or 64 (default: the hash size, 32 for none)")

	var tlsHash string
	tls := &cobra.Command{
		Use: "tls-psk", Short: "Generate a configured TLS PSK", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := nvmefmt.ParseHash(tlsHash)
			if err != nil {
				return fmt.Errorf("--hash: %w", err)
			}
			if h.Size() == 0 || h == nvmefmt.SHA512 {
				return fmt.Errorf("--hash: a TLS PSK uses sha256 or sha384, not %s", h)
			}
			psk := make([]byte, h.Size())
			defer clear(psk)
			rand.Read(psk)
			key, err := nvmefmt.EncodeTLSPSK(h, psk)
			if err != nil {
				return err
			}
			return a.printKey(map[string]any{"kind": "tls-psk", "hash": h.String(), "length": len(psk), "key": key}, key)
		},
	}
	tls.Flags().StringVar(&tlsHash, "hash", "sha256", "sha256 (32-byte PSK) or sha384 (48-byte PSK)")
	cmd.AddCommand(dhchap, tls)
	return cmd
}

// readSecretHex decodes the --secret value, reading it from stdin for "-".
// Errors never repeat the input.
func (a *app) readSecretHex(cmd *cobra.Command, v string) ([]byte, error) {
	if v == "-" {
		line, err := readLine(cmd.InOrStdin())
		if err != nil {
			return nil, err
		}
		v = line
	}
	b, err := hex.DecodeString(strings.TrimSpace(v))
	if err != nil || len(b) == 0 {
		return nil, errors.New("--secret: not a hex string (give the secret as hex digits)")
	}
	return b, nil
}

func readLine(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return "", err
		}
		return "", errors.New("stdin is empty")
	}
	return strings.TrimSpace(sc.Text()), nil
}

// printKey prints a generated or formatted key: the JSON object, or the key
// string alone as the last line.
func (a *app) printKey(obj map[string]any, key string) error {
	if a.output == "json" {
		return writeJSON(a.stdout, obj)
	}
	_, err := fmt.Fprintln(a.stdout, key)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
