package benchload

import (
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
