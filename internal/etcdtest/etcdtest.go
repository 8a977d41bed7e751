// Package etcdtest runs a real etcd cluster in the test's process (the
// etcd server's embed package: the same server the etcd binary runs, with
// its WAL fsync'd), for the tests and benchmarks of the etcd backends.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a running cluster of members.
type Cluster struct {
	Endpoints []string
	Members   []*embed.Etcd
}

// Start starts a cluster of n members on loopback ports, each with its
// data in a temporary directory of tb, and stops it when tb ends.
func Start(tb testing.TB, n int) *Cluster {
	tb.Helper()
	type addr struct{ client, peer url.URL }
	addrs := make([]addr, n)
	var initial []string
	for i := range addrs {
		addrs[i] = addr{client: freeURL(tb), peer: freeURL(tb)}
		initial = append(initial, fmt.Sprintf("m%d=%s", i, addrs[i].peer.String()))
	}
	c := &Cluster{}
	dir := tb.TempDir()
	for i, a := range addrs {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{a.client}, []url.URL{a.client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{a.peer}, []url.URL{a.peer}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "etcdtest"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			tb.Fatalf("etcdtest: start member %d: %v", i, err)
		}
		c.Members = append(c.Members, e)
		c.Endpoints = append(c.Endpoints, a.client.String())
	}
	tb.Cleanup(c.Close)
	for i, e := range c.Members {
		select {
		case <-e.Server.ReadyNotify():
		case err := <-e.Err():
			tb.Fatalf("etcdtest: member %d: %v", i, err)
		case <-time.After(60 * time.Second):
			tb.Fatalf("etcdtest: member %d not ready after 60s", i)
		}
	}
	return c
}

// Client is a client of every member, closed when tb ends.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Stop stops member i alone (the others keep quorum if there are enough).
func (c *Cluster) Stop(i int) {
	if e := c.Members[i]; e != nil {
		e.Close()
		c.Members[i] = nil
	}
}

// Close stops every member still running.
func (c *Cluster) Close() {
	for _, e := range c.Members {
		if e != nil {
			e.Close()
		}
	}
	c.Members = nil
}

func freeURL(tb testing.TB) url.URL {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}
}
