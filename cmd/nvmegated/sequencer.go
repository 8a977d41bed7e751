package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/spiffetls/tlsconfig"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/nvmegate/nvmegate/forward"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/leader"
)

// sequencer is what makes the replicas one writer (DESIGN §12): the term's
// leader sequences every write in the replicated log, and the others
// forward theirs to it over the peer listener. Its address is the value of
// the leader's election key.
type sequencer struct {
	lis       net.Listener
	advertise string
	srv       *grpc.Server
	client    *forward.Client
	value     string // this replica's election value
	peers     []spiffeid.ID
	self      atomic.Pointer[spiffeid.ID]
}

// candidate is the election key's value: who leads and where its peer
// listener is.
type candidate struct {
	Name string `json:"name"`
	Peer string `json:"peer"`
	// Records is the newest kind of store record the replica applies
	// (recordsNow); replicas of older versions have none. The leader
	// writes a kind only once every candidate applies it, so that a
	// rolling upgrade never leaves an older replica unable to project the
	// log (it would fail closed).
	Records int `json:"records,omitempty"`
}

// Kinds of store records added after the one writer, by the version of
// the replicas that apply them.
const (
	recordsPolicyAndRoots = 1 // the policy in force, access root notes
	recordsNow            = recordsPolicyAndRoots
)

// openSequencer binds the peer listener; its credentials come with the
// gateway's SVID (start).
func openSequencer(c EtcdConfig, listen, name string) (*sequencer, error) {
	addr := c.PeerListen
	if addr == "" {
		host, _, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("etcd.peer_listen: derive from listen %q: %w", listen, err)
		}
		addr = net.JoinHostPort(host, "0")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("etcd.peer_listen %s: %w", addr, err)
	}
	adv := c.PeerAdvertise
	if adv == "" {
		host, port, _ := net.SplitHostPort(lis.Addr().String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			if host, err = routedHost(c.Endpoints); err != nil {
				lis.Close()
				return nil, fmt.Errorf("etcd.peer_advertise: not set, and %w", err)
			}
		}
		adv = net.JoinHostPort(host, port)
	}
	v, _ := json.Marshal(candidate{Name: name, Peer: adv, Records: recordsNow})
	s := &sequencer{lis: lis, advertise: adv, value: string(v)}
	for _, p := range c.Peers {
		id, err := spiffeid.FromString(p)
		if err != nil {
			lis.Close()
			return nil, fmt.Errorf("etcd.peers: %w", err)
		}
		s.peers = append(s.peers, id)
	}
	return s, nil
}

// routedHost is this machine's address on the route to the first etcd
// member (a pod's IP; no packet is sent), else its host name: what the
// other replicas, which reach etcd too, most likely reach it at.
func routedHost(endpoints []string) (string, error) {
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			continue
		}
		conn, err := net.Dial("udp", u.Host)
		if err != nil {
			continue
		}
		host, _, _ := net.SplitHostPort(conn.LocalAddr().String())
		conn.Close()
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			return host, nil
		}
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no route to etcd and no host name: %w", err)
	}
	return h, nil
}

// isPeer says whether id may forward writes to this replica or answer as
// the leader: the gateway's own SPIFFE ID, or one of etcd.peers.
func (s *sequencer) isPeer(id spiffeid.ID) bool {
	if self := s.self.Load(); self != nil && id == *self {
		return true
	}
	return slices.Contains(s.peers, id)
}

// dial gives the forwarding client the gateway's SVID: it talks to the
// other replicas' peer services as self.
func (s *sequencer) dial(src identity.Source, self spiffeid.ID) {
	s.self.Store(&self)
	s.client.Creds = identity.ClientCredentials(src, tlsconfig.AdaptMatcher(func(id spiffeid.ID) error {
		if !s.isPeer(id) {
			return fmt.Errorf("%s is not a gateway replica", id)
		}
		return nil
	}))
}

// serveWith makes the peer server with the gateway's SVID; store and log
// are this replica's.
func (s *sequencer) serveWith(src identity.Source, self spiffeid.ID, st forward.Store, lg forward.Log) {
	s.srv = grpc.NewServer(grpc.Creds(identity.ServerCredentials(src, self.TrustDomain())))
	(&forward.Server{Store: st, Log: lg, Peers: s.isPeer}).Register(s.srv)
}

// resolver names the leader's peer address from the election (one read of
// etcd; the client keeps the connection until it fails).
func (r *replication) resolver(own string) forward.Resolver {
	return func(ctx context.Context) (string, bool, bool, error) {
		v, _, ok, err := leader.Current(ctx, r.client, r.prefix+"leader/")
		if err != nil || !ok {
			return "", false, ok, err
		}
		var c candidate
		if err := json.Unmarshal([]byte(v), &c); err != nil || c.Peer == "" {
			return "", false, false, fmt.Errorf("the leader's election value %q names no peer address (a replica of an older version leads)", v)
		}
		return c.Peer, v == own, true, nil
	}
}

// serve serves forwarded writes until ctx ends.
func (s *sequencer) serve(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		s.srv.Stop() // forwarded writes in flight fail; their senders retry the next leader
	}()
	if err := s.srv.Serve(s.lis); err != nil && ctx.Err() == nil {
		return fmt.Errorf("peer listener: %w", err)
	}
	return nil
}

func (s *sequencer) close() {
	if s.srv != nil {
		s.srv.Stop()
	}
	s.lis.Close()
	if s.client != nil {
		s.client.Close()
	}
}

// allApply says whether every replica campaigning in the election (every
// live one) applies store records of kind: the leader writes a record of
// a newer kind only then.
func (r *replication) allApply(ctx context.Context, kind int) (bool, error) {
	resp, err := r.client.Get(ctx, r.prefix+"leader/", clientv3.WithPrefix())
	if err != nil {
		return false, fmt.Errorf("etcd: read the replicas' versions: %w", err)
	}
	for _, kv := range resp.Kvs {
		var c candidate
		if json.Unmarshal(kv.Value, &c) != nil || c.Records < kind {
			return false, nil
		}
	}
	return true, nil
}
