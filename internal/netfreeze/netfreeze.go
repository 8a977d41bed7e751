package netfreeze

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards connections to one address until Freeze.
type Proxy struct {
	lis    net.Listener
	frozen atomic.Bool
	thaw   chan struct{}
	once   sync.Once
}

// Start proxies a loopback port to the address to, until tb ends.
func Start(tb testing.TB, to string) *Proxy {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{lis: lis, thaw: make(chan struct{})}
	tb.Cleanup(func() { lis.Close(); p.once.Do(func() { close(p.thaw) }) })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			if p.frozen.Load() {
				go p.hold(c) // a frozen process's backlog: accepted, never answered
				continue
			}
			up, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			go p.pipe(c, up)
			go p.pipe(up, c)
		}
	}()
	return p
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// Freeze stops all forwarding, on the open connections and new ones.
func (p *Proxy) Freeze() { p.frozen.Store(true) }

func (p *Proxy) hold(c net.Conn) {
	<-p.thaw
	c.Close()
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.frozen.Load() {
			<-p.thaw // hold what came; forward nothing more
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
