package benchload

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Run calls op(i, worker) for i = 1..b.N, spread over workers goroutines,
// each op timed, and reports "<unit>/s" and "p99-ms". It resets the timer
// before the first op and stops it after the last. A failed op fails the
// benchmark and ends its worker.
func Run(b *testing.B, workers int, unit string, op func(i, worker int) error) {
	var (
		next atomic.Int64
		mu   sync.Mutex
		lat  []time.Duration
		wg   sync.WaitGroup
	)
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
				t0 := time.Now()
				if err := op(i, w); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), unit+"/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}

// RunOpen calls op(i) for i = 1..b.N at Poisson arrivals of rate per
// second (a fixed seed, so every run asks the same), each in a goroutine
// of its own, whether or not the ones before it have returned: the load of
// many independent callers, which a closed loop of workers does not show
// (a slow answer there also slows the asking). Each op is timed from when
// it is issued: the runtime wakes a sleeper up to a millisecond late, so
// arrivals due within one come together, as independent callers' do; no
// op waits for another to be issued. It reports "<unit>/s" done, "p50-ms"
// and "p99-ms".
func RunOpen(b *testing.B, rate float64, unit string, op func(i int) error) {
	rng := rand.New(rand.NewPCG(1, 2))
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	at := time.Duration(0)
	for i := 1; i <= b.N; i++ {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		arrival := start.Add(at)
		if d := time.Until(arrival); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			if err := op(i); err != nil {
				b.Error(err)
			}
			lat[i-1] = time.Since(t0)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), unit+"/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
