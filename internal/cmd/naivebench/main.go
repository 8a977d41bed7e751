// Command naivebench is the baseline of the side-by-side benchmark
// (scripts/sidebyside.sh): the work of one grant composed the naive way,
// from the same real parts nvmegate uses — a policy decision from an OPA
// server over HTTP with the same Rego, a Vault KV read of the access root,
// a Vault Transit HMAC, and a bbolt append with fsync — with C workers for
// a duration, reported like `nvmegate bench connect`.
//
//	naivebench --opa http://127.0.0.1:8181 --vault http://127.0.0.1:8200 --token root \
//	    --policy-input policy/selftest.json --concurrency 32 --duration 20s --db /tmp/naive.db
package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	vault "github.com/hashicorp/vault/api"
	bolt "go.etcd.io/bbolt"

	"github.com/nvmegate/nvmegate/loadgen"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "naivebench:", err)
		os.Exit(1)
	}
}

func run() error {
	opaURL := flag.String("opa", "http://127.0.0.1:8181", "OPA server")
	vaultAddr := flag.String("vault", "http://127.0.0.1:8200", "Vault address")
	token := flag.String("token", "root", "Vault token")
	samples := flag.String("policy-input", "policy/selftest.json", "the policy's self-test samples (the connect input is taken from them)")
	nsCount := flag.Int("namespaces", 8, "namespaces in the connect input (as bench connect --namespaces)")
	conc := flag.Int("concurrency", 32, "grants in flight")
	dur := flag.Duration("duration", 20*time.Second, "how long")
	dbPath := flag.String("db", "naive.db", "bbolt file for the appends")
	flag.Parse()

	input, err := connectInput(*samples, *nsCount)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]any{"input": input})

	vc, err := vault.NewClient(&vault.Config{Address: *vaultAddr, MaxRetries: 0, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	vc.SetToken(*token)
	ctx := context.Background()
	if err := vc.Sys().MountWithContext(ctx, "naive-transit", &vault.MountInput{Type: "transit"}); err != nil {
		return fmt.Errorf("mount transit: %w", err)
	}
	if _, err := vc.Logical().WriteWithContext(ctx, "naive-transit/keys/naive-hmac", map[string]any{"type": "hmac", "key_size": 32}); err != nil {
		return fmt.Errorf("transit key: %w", err)
	}
	root := make([]byte, 32)
	if _, err := vc.KVv2("secret").Put(ctx, "naive/root", map[string]any{"root": base64.StdEncoding.EncodeToString(root)}); err != nil {
		return fmt.Errorf("kv put: %w", err)
	}
	db, err := bolt.Open(*dbPath, 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists([]byte("grants")); return err }); err != nil {
		return err
	}
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *conc * 2}, Timeout: 10 * time.Second}
	record := bytes.Repeat([]byte("x"), 600) // about one grant's JSON

	var seq atomic.Uint64
	grant := func(ctx context.Context) error {
		resp, err := httpc.Post(*opaURL+"/v1/data/nvmegate/authz/decision", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		var out struct {
			Result struct {
				Allow bool `json:"allow"`
			} `json:"result"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if !out.Result.Allow {
			return errors.New("policy denied the sample connect")
		}
		if _, err := vc.KVv2("secret").Get(ctx, "naive/root"); err != nil {
			return err
		}
		if _, err := vc.Logical().WriteWithContext(ctx, "naive-transit/hmac/naive-hmac", map[string]any{
			"input": base64.StdEncoding.EncodeToString([]byte("nqn.2014-08.org.nvmexpress:uuid:0c6f2d46-2b8c-5b0e-9b7a-6a3e2b1d7f10"))}); err != nil {
			return err
		}
		return db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("grants")).Put(binary.BigEndian.AppendUint64(nil, seq.Add(1)), record)
		})
	}

	rctx, cancel := context.WithTimeout(ctx, *dur)
	defer cancel()
	var (
		mu   sync.Mutex
		lat  []time.Duration
		errs = map[string]int{}
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil {
				t0 := time.Now()
				err := grant(rctx)
				d := time.Since(t0)
				mu.Lock()
				if err != nil && rctx.Err() == nil {
					errs[err.Error()]++
				} else if err == nil {
					lat = append(lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	r := &loadgen.Result{Elapsed: el, Latencies: lat, Errors: errs}
	fmt.Print(loadgen.Summary(r))
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("client RSS max %d MiB\n", ru.Maxrss/1024)
	return nil
}

// connectInput takes the allowed connect sample of the policy's self-test
// and gives it n namespaces, like the gateway's input for an n-namespace job.
func connectInput(path string, n int) (map[string]any, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var st struct {
		Samples []struct {
			Name  string         `json:"name"`
			Input map[string]any `json:"input"`
		} `json:"samples"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, err
	}
	for _, s := range st.Samples {
		if s.Name != "node may connect within its job" {
			continue
		}
		res := s.Input["resource"].(map[string]any)
		one := res["namespaces"].([]any)[0].(map[string]any)
		var nss []any
		for i := range n {
			ns := map[string]any{}
			for k, v := range one {
				ns[k] = v
			}
			ns["nsid"] = i + 1
			nss = append(nss, ns)
		}
		res["namespaces"] = nss
		return s.Input, nil
	}
	return nil, errors.New("no 'node may connect within its job' sample in " + path)
}
