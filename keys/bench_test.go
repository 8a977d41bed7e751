package keys_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/keys/localstore"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
)

// BenchmarkDerive is the derivation of a connect's credentials from a
// root: both DH-HMAC-CHAP secrets and a TLS PSK, formatted.
//
//	go test -run '^$' -bench 'Derive|ManagerCredentials' -benchmem ./keys
func BenchmarkDerive(b *testing.B) {
	for _, p := range []struct {
		name string
		p    keys.CredentialParams
	}{
		{"dhchap-sha256", keys.CredentialParams{DHCHAPHash: nvmefmt.SHA256}},
		{"dhchap-sha384-bidi+tls", all},
	} {
		b.Run(p.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := keys.Derive(root1, host1, sub, p.p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkManagerCredentials is the hot path of a connect: the cached
// root, the staleness check and the derivation, for 10,000 distinct hosts;
// it reports the key-store round trips per 10,000 connects (0 once warm).
func BenchmarkManagerCredentials(b *testing.B) {
	dir := b.TempDir()
	s, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	m, err := keys.NewManager(keys.Options{Backend: s})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.Rotate(ctx, sub, "bench"); err != nil {
		b.Fatal(err)
	}
	hosts := make([]string, 10000)
	for i := range hosts {
		hosts[i] = "nqn.2014-08.org.nvmexpress:uuid:" + strconv.Itoa(10000000+i) + "-aaaa-4000-8000-000000000000"
	}
	reads := m.BackendReads()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := m.Credentials(ctx, hosts[i%len(hosts)], sub, all); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(m.BackendReads()-reads)*10000/float64(b.N), "roundtrips/10k-connects")
}

// BenchmarkNamespaceKeys is what a target's whole state costs per
// encrypted namespace since issue 29: the key store's record read to
// confirm the kept key ("confirmed", one round trip, nothing unwrapped),
// against an unwrap on every use ("unwrap-each": what a cache-less
// manager would pay) — on the local store, where a round trip is a bbolt
// read and an unwrap an AES-GCM open.
//
//	go test -run '^$' -bench NamespaceKeys -benchmem ./keys
func BenchmarkNamespaceKeys(b *testing.B) {
	dir := b.TempDir()
	s, err := localstore.Open(filepath.Join(dir, "k.db"), filepath.Join(dir, "k.key"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	ns := sub + "/1"
	b.Run("confirmed", func(b *testing.B) {
		m, err := keys.NewManager(keys.Options{Backend: s})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil {
			b.Fatal(err)
		}
		reads := m.BackendReads()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.NamespaceKeys(ctx, ns, "rec-1"); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(m.BackendReads()-reads)/float64(b.N), "roundtrips/op")
	})
	b.Run("unwrap-each", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rec, err := s.DataKey(ctx, ns)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Unwrap(ctx, ns, rec.Wrapped); err != nil {
				b.Fatal(err)
			}
		}
	})
}
