package audit_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nvmegate/nvmegate/attest"
	"github.com/nvmegate/nvmegate/audit"
)

// BenchmarkAppend measures durable appends (each returns after its fsync'd
// commit) with 1, 16 and 256 concurrent appenders. b.N is the total number
// of appends; appends/s and the p99 latency of one Append are reported.
func BenchmarkAppend(b *testing.B) {
	for _, workers := range []int{1, 16, 256} {
		b.Run(benchName(workers), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "audit.db")
			l, err := audit.Open(path, audit.Options{Origin: testOrigin, Signer: testSigner(b, "k", 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			entries := make([]audit.Entry, 1024)
			for i := range entries {
				entries[i] = sampleEntry(i)
			}
			var next atomic.Int64
			lat := make([][]time.Duration, workers)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for {
						i := next.Add(1) - 1
						if i >= int64(b.N) {
							return
						}
						t0 := time.Now()
						if _, _, err := l.Append(ctx, entries[i%1024]); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
					}
				}(w)
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			all := slices.Concat(lat...)
			slices.Sort(all)
			if len(all) > 0 {
				b.ReportMetric(float64(len(all))/el.Seconds(), "appends/s")
				b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
				enc, _ := entries[0].Encode()
				b.ReportMetric(float64(len(enc)), "entry-bytes")
				var ru syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
				b.ReportMetric(float64(ru.Maxrss/1024), "maxrss-MiB")
			}
		})
	}
}

func benchName(w int) string {
	switch w {
	case 1:
		return "appenders=1"
	case 16:
		return "appenders=16"
	}
	return "appenders=256"
}

// BenchmarkCheckpoint measures signing one checkpoint (Ed25519 and ECDSA
// P-256): consistency proof from the stored tiles, its verification, the
// signed note and its durable write. One entry is appended per iteration
// outside the timer so that every Checkpoint signs.
func BenchmarkCheckpoint(b *testing.B) {
	ecdsaKey, err := attest.GenerateKey(attest.ECDSAP256, nil)
	if err != nil {
		b.Fatal(err)
	}
	ecdsaSigner, _ := attest.NewLocalSigner(ecdsaKey, 1)
	for _, s := range []struct {
		name string
		s    attest.Signer
	}{{"ed25519", testSigner(b, "k", 1)}, {"ecdsa-p256", ecdsaSigner}} {
		b.Run(s.name, func(b *testing.B) {
			ctx := context.Background()
			l, err := audit.Open(filepath.Join(b.TempDir(), "audit.db"), audit.Options{Origin: testOrigin, Signer: s.s})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			appendParallel(b, l, 0, 10000)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if _, _, err := l.Append(ctx, sampleEntry(i)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := l.Checkpoint(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVerify measures offline verification of an export of 200,000
// entries; entries/s is the figure of merit.
func BenchmarkVerify(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	l, err := audit.Open(filepath.Join(dir, "audit.db"), audit.Options{Origin: testOrigin, Signer: testSigner(b, "k", 1)})
	if err != nil {
		b.Fatal(err)
	}
	const n = 200_000
	appendParallel(b, l, 0, n)
	if _, err := l.Checkpoint(ctx); err != nil {
		b.Fatal(err)
	}
	out := filepath.Join(dir, "export")
	if _, err := l.Export(ctx, out, 0); err != nil {
		b.Fatal(err)
	}
	l.Close()
	keys := []attest.PublicKey{testSigner(b, "k", 1).PublicKey()}
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < b.N; i++ {
		r, err := audit.Verify(ctx, out, keys, nil, nil)
		if err != nil || !r.OK() {
			b.Fatal(err, r.Failures)
		}
	}
	b.ReportMetric(float64(n*b.N)/time.Since(start).Seconds(), "entries/s")
	// CPU time used, so that a figure taken on a busy machine can be read:
	// entries/s ≈ entries/cpu-s × cores when the cores are free.
	b.ReportMetric(float64(n*b.N)/(cpuTime()-cpu0).Seconds(), "entries/cpu-s")
}

// cpuTime is the user+system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
