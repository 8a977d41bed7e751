package forward

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/store"
)

// The service's name and methods.
const (
	serviceName  = "nvmegate.internal.v1.Sequencer"
	methodStore  = "/" + serviceName + "/Store"
	methodAppend = "/" + serviceName + "/Append"
	// History serves the audit log's history etcd no longer holds to a
	// copy that lacks it (audit.HistorySource): read-only, any replica.
	methodHistory = "/" + serviceName + "/History"
)

// Store is the leader's store as the service uses it (*store.DB).
type Store interface {
	Apply(ctx context.Context, req []byte) ([]byte, error)
}

// Log is the leader's audit log as the service uses it (*audit.Log).
type Log interface {
	AppendEncoded(ctx context.Context, data []byte) (uint64, error)
	History(ctx context.Context, from, to uint64) (audit.HistoryPage, error)
}

// historyRange is a History request.
type historyRange struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
}

// outcome is a call's answer as data.
type outcome struct {
	Result []byte `json:"result,omitempty"`
	Index  uint64 `json:"index,omitempty"`
	// NotLeader: the callee does not lead; ask the leader again.
	NotLeader bool `json:"not_leader,omitempty"`
	// Code and Message are a refusal (an nvmegate error code), or, with
	// Unavailable, a failure that leaves the write's fate unknown (the
	// log could not be written): the caller fails closed.
	Code        string `json:"code,omitempty"`
	Field       string `json:"field,omitempty"`
	Message     string `json:"message,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
}

// Server is the service on the leader: every replica serves it, and
// answers "not the leader" unless it leads.
type Server struct {
	Store Store
	Log   Log
	// Peers authorizes a caller's SPIFFE ID (the other replicas').
	Peers func(spiffeid.ID) bool

	answered *answers // by request ID
}

// Register adds the service to s.
func (srv *Server) Register(s *grpc.Server) {
	srv.answered = newAnswers()
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: serviceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "Store", Handler: srv.handler(methodStore, srv.store)},
			{MethodName: "Append", Handler: srv.handler(methodAppend, srv.append)},
			{MethodName: "History", Handler: srv.historyHandler},
		},
		Metadata: "forward/forward.go",
	}, srv)
}

// handler is a method's gRPC handler: the server's interceptors (if any)
// run around serve, as around a generated handler.
func (srv *Server) handler(method string, fn func(context.Context, []byte) outcome) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.BytesValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		serve := func(ctx context.Context, req any) (any, error) {
			return srv.serve(ctx, req.(*wrapperspb.BytesValue), fn)
		}
		if interceptor == nil {
			return serve(ctx, in)
		}
		return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: method}, serve)
	}
}

// historyHandler serves a page of the log's history to another replica.
func (srv *Server) historyHandler(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(wrapperspb.BytesValue)
	if err := dec(in); err != nil {
		return nil, err
	}
	serve := func(ctx context.Context, req any) (any, error) { return srv.history(ctx, req.(*wrapperspb.BytesValue)) }
	if interceptor == nil {
		return serve(ctx, in)
	}
	return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodHistory}, serve)
}

func (srv *Server) history(ctx context.Context, in *wrapperspb.BytesValue) (any, error) {
	id, ok := identity.PeerID(ctx)
	if !ok || srv.Peers == nil || !srv.Peers(id) {
		return nil, status.Errorf(codes.PermissionDenied, "only the gateway's replicas read the log's history (caller %s)", id)
	}
	var r historyRange
	if err := json.Unmarshal(in.Value, &r); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "a history request: %v", err)
	}
	page, err := srv.Log.History(ctx, r.From, r.To)
	switch {
	case errors.Is(err, audit.ErrTreeSize):
		return nil, status.Errorf(codes.OutOfRange, "%v", err)
	case err != nil:
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	out, err := json.Marshal(page)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode the page: %v", err)
	}
	return wrapperspb.Bytes(out), nil
}

// serve answers one forwarded request from a replica.
func (srv *Server) serve(ctx context.Context, in *wrapperspb.BytesValue, fn func(context.Context, []byte) outcome) (any, error) {
	id, ok := identity.PeerID(ctx)
	if !ok || srv.Peers == nil || !srv.Peers(id) {
		return nil, status.Errorf(codes.PermissionDenied, "only the gateway's replicas forward writes (caller %s)", id)
	}
	var o outcome
	if len(in.Value) < idLen {
		o = outcome{Code: nvmegate.EINVALID, Message: "a forwarded write without its request ID"}
	} else {
		// A retry (its answer was lost) is answered as the first
		// call was, not run again.
		id, body := string(in.Value[:idLen]), in.Value[idLen:]
		o = srv.answered.do(id, func() outcome { return fn(store.WithRequestID(ctx, id), body) })
	}
	out, err := json.Marshal(o)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode the answer: %v", err)
	}
	return wrapperspb.Bytes(out), nil
}

func (srv *Server) store(ctx context.Context, req []byte) outcome {
	out, err := srv.Store.Apply(ctx, req)
	if err != nil {
		return failure(err)
	}
	return outcome{Result: out}
}

func (srv *Server) append(ctx context.Context, data []byte) outcome {
	idx, err := srv.Log.AppendEncoded(ctx, data)
	if err != nil {
		return failure(err)
	}
	return outcome{Index: idx}
}

// failure is err as an outcome.
func failure(err error) outcome {
	switch {
	case errors.Is(err, store.ErrNotLeader), errors.Is(err, audit.ErrFenced):
		// Not the leader, or no longer: nothing was stored (a fenced
		// commit stores nothing); the sender asks the next leader.
		return outcome{NotLeader: true}
	case nvmegate.ErrorCode(err) != "":
		var e *nvmegate.Error
		if errors.As(err, &e) {
			return outcome{Code: e.Code, Field: e.Field, Message: e.Message}
		}
		return outcome{Code: nvmegate.ErrorCode(err), Message: err.Error()}
	case errors.Is(err, audit.ErrInvalidEntry), errors.Is(err, audit.ErrKeyMaterial):
		return outcome{Code: nvmegate.EINVALID, Message: err.Error()}
	}
	return outcome{Unavailable: true, Message: err.Error()}
}

// errOf is the follower's error for an outcome: the leader's refusal as
// the store gives it, or a failure that leaves the write's fate unknown.
func errOf(o outcome) error {
	switch {
	case o.Code != "":
		return &nvmegate.Error{Code: o.Code, Field: o.Field, Message: o.Message}
	case o.Unavailable:
		return fmt.Errorf("%w: the leader: %s", audit.ErrUnavailable, o.Message)
	}
	return nil
}

// Resolver names the leader's peer address, and whether this replica is
// the leader (its own writes are not forwarded); ok is false while none
// leads.
type Resolver func(ctx context.Context) (addr string, self, ok bool, err error)

// Client forwards this replica's writes to the leader. It implements
// store.Forwarder and audit.AppendForwarder.
type Client struct {
	Resolve Resolver
	Creds   credentials.TransportCredentials
	// Leading, if set, says whether this replica leads now: its appends
	// are then its own, without asking the resolver.
	Leading func() bool
	// Patience bounds how long a write waits for a leader (a failover:
	// the lease's TTL and a campaign); default 15 s.
	Patience time.Duration

	mu      sync.Mutex
	stopped chan struct{}               // closed by Abort
	conn    *grpc.ClientConn            // the leader's, as last resolved
	self    string                      // this replica's peer address, once the resolver named it leader
	conns   map[string]*grpc.ClientConn // by address, closed by Close
}

var (
	_ store.Forwarder       = (*Client)(nil)
	_ audit.AppendForwarder = (*Client)(nil)
	_ audit.HistorySource   = (*Client)(nil)
)

// Forward sends a store write to the leader (store.Forwarder).
func (c *Client) Forward(ctx context.Context, req []byte) ([]byte, error) {
	o, err := c.call(ctx, methodStore, withID(req), false)
	if errors.Is(err, errSelf) {
		return nil, store.ErrLeadsHere
	}
	if err != nil {
		return nil, err
	}
	if o.NotLeader {
		return nil, store.ErrNotLeader
	}
	if err := errOf(o); err != nil {
		return nil, err
	}
	return o.Result, nil
}

// ForwardAppend appends an encoded entry on the leader
// (audit.AppendForwarder); handled is false if this replica leads.
func (c *Client) ForwardAppend(ctx context.Context, data []byte) (uint64, bool, error) {
	o, err := c.call(ctx, methodAppend, withID(data), true)
	if errors.Is(err, errSelf) {
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	if o.NotLeader {
		return 0, true, fmt.Errorf("%w: no leader took the append", audit.ErrUnavailable)
	}
	return o.Index, true, errOf(o)
}

// History fetches a page of the log's history from the leader's copy
// (audit.HistorySource): a copy behind the tail etcd keeps fills from it.
// The page is checked by the copy, not trusted.
func (c *Client) History(ctx context.Context, from, to uint64) (audit.HistoryPage, error) {
	conn, self, err := c.leader(ctx)
	switch {
	case err != nil:
		return audit.HistoryPage{}, fmt.Errorf("%w: no replica to fetch the history from: %v", audit.ErrUnavailable, err)
	case self:
		return audit.HistoryPage{}, fmt.Errorf("%w: this replica leads, and its copy lacks the history", audit.ErrUnavailable)
	}
	req, _ := json.Marshal(historyRange{From: from, To: to})
	out := new(wrapperspb.BytesValue)
	if err := conn.Invoke(ctx, methodHistory, wrapperspb.Bytes(req), out, grpc.MaxCallRecvMsgSize(maxHistoryMsg)); err != nil {
		c.forget(conn)
		return audit.HistoryPage{}, fmt.Errorf("%w: the history from %d: %v", audit.ErrUnavailable, from, err)
	}
	var page audit.HistoryPage
	if err := json.Unmarshal(out.Value, &page); err != nil {
		return audit.HistoryPage{}, fmt.Errorf("%w: a history page: %v", audit.ErrCorrupt, err)
	}
	return page, nil
}

// maxHistoryMsg bounds a history page on the wire (a page holds about
// 2 MiB of entries and payloads, base64 in JSON).
const maxHistoryMsg = 16 << 20

// idLen is the length of a request's ID, which prefixes its body.
const idLen = 32

// withID prefixes body with a new random request ID: the call's retries
// send the same bytes.
func withID(body []byte) []byte {
	var id [idLen / 2]byte
	if _, err := rand.Read(id[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return append([]byte(hex.EncodeToString(id[:])), body...)
}

// errSelf: this replica leads, or (for an append) none does; the append
// is its own to make. An append made with no leader goes to the Replica
// with its compare on the log's head, as every append did before one
// writer: the log cannot fork, and a replica's start (its policy load's
// entry) does not wait for an election.
var errSelf = errors.New("forward: this replica leads")

// errNoLeader is the resolver's answer while no replica leads.
var errNoLeader = errors.New("no replica leads")

// call sends req until a leader answers, within the patience and ctx.
// With selfOK, a resolver naming this replica, or none, ends it with
// errSelf.
func (c *Client) call(ctx context.Context, method string, req []byte, selfOK bool) (outcome, error) {
	// A write may run under a context that outlives the caller (its
	// commit must be learnt); Abort ends it all the same.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-c.aborted():
			cancel()
		case <-ctx.Done():
		}
	}()
	patience := c.Patience
	if patience <= 0 {
		patience = 15 * time.Second
	}
	deadline := time.Now().Add(patience)
	backoff := 20 * time.Millisecond
	var last error
	// sent: a leader may have taken the request (it did not answer "not
	// the leader"). From then on the request goes only where its ID is
	// checked — a leader's peer service, this replica's own included —
	// and giving up is "outcome unknown", never "not made".
	sent := false
	for {
		if !sent && c.Leading != nil && c.Leading() {
			// Elected while the write waited for a leader, before any
			// leader saw it: its own to make now.
			return outcome{}, errSelf
		}
		conn, self, err := c.leader(ctx)
		switch {
		case !sent && selfOK && (err == nil && self || errors.Is(err, errNoLeader)):
			return outcome{}, errSelf
		case err == nil && (!self || sent):
			if conn == nil {
				conn, err = c.dial(ctx)
				if err != nil {
					break
				}
			}
			out := new(wrapperspb.BytesValue)
			err = conn.Invoke(ctx, method, wrapperspb.Bytes(req), out)
			if err == nil {
				var o outcome
				if err := json.Unmarshal(out.Value, &o); err != nil {
					return outcome{}, fmt.Errorf("%w: the leader's answer: %v", audit.ErrUnavailable, err)
				}
				if !o.NotLeader {
					return o, nil
				}
				err = errors.New("the replica named leader does not lead")
			} else if !selfOK {
				// A store write may have reached the leader before the
				// answer was lost. (An append is only deduplicated by the
				// leader that took it: it is retried as before, and one
				// made with no leader goes to etcd, so that a replica's
				// start never waits on an answer lost with a leader.)
				sent = true
			}
			if status.Code(err) == codes.PermissionDenied {
				return outcome{}, fmt.Errorf("%w: the leader refused this replica: %v", audit.ErrUnavailable, err)
			}
			c.forget(conn)
		case err == nil:
			err = errors.New("this replica leads but does not sequence yet")
		}
		last = err
		if ctx.Err() != nil || time.Now().After(deadline) {
			if ctx.Err() != nil {
				last = ctx.Err()
			}
			switch {
			case sent:
				return outcome{}, fmt.Errorf("%w: the write's outcome is unknown: a leader may have made it and did not answer (%v)", audit.ErrUnavailable, last)
			case method == methodStore:
				return outcome{NotLeader: true}, nil
			}
			return outcome{}, fmt.Errorf("%w: no leader within %s: %v", audit.ErrUnavailable, patience, last)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// leader is a connection to the leader: the one that answered last, or
// one to the address the resolver names (dialled once per address).
func (c *Client) leader(ctx context.Context) (*grpc.ClientConn, bool, error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn != nil {
		return conn, false, nil
	}
	addr, self, ok, err := c.Resolve(ctx)
	switch {
	case err != nil:
		return nil, false, err
	case !ok:
		return nil, false, errNoLeader
	case self:
		c.mu.Lock()
		c.self = addr // dialled only for a request a leader may have taken
		c.mu.Unlock()
		return nil, true, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = map[string]*grpc.ClientConn{}
	}
	conn = c.conns[addr]
	if conn == nil {
		if conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(c.Creds)); err != nil {
			return nil, false, err
		}
		c.conns[addr] = conn
	}
	c.conn = conn
	return conn, false, nil
}

// dial is a connection to this replica's own peer service (it leads): a
// retry of a request another leader may have taken goes through the
// service, which checks its ID.
func (c *Client) dial(context.Context) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.self == "" {
		return nil, errors.New("this replica's peer address is not known")
	}
	if c.conns == nil {
		c.conns = map[string]*grpc.ClientConn{}
	}
	if conn := c.conns[c.self]; conn != nil {
		return conn, nil
	}
	conn, err := grpc.NewClient(c.self, grpc.WithTransportCredentials(c.Creds))
	if err != nil {
		return nil, err
	}
	c.conns[c.self] = conn
	return conn, nil
}

// forget drops conn as the leader's: the next call resolves again.
func (c *Client) forget(conn *grpc.ClientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.conn = nil
	}
}

// aborted is closed once Abort was called.
func (c *Client) aborted() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped == nil {
		c.stopped = make(chan struct{})
	}
	return c.stopped
}

// Abort ends every call in flight and to come (a stop's deadline): they
// fail as unavailable, or, for a store write, as not sequenced.
func (c *Client) Abort() {
	c.aborted()
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.stopped:
	default:
		close(c.stopped)
	}
}

// Close closes the connections.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	c.conns, c.conn = nil, nil
	return nil
}

// answers keeps recent answers by request ID: a retry within answerKeep
// gets the first answer (waiting for it if the first is still running).
type answers struct {
	mu  sync.Mutex
	m   map[string]*answer
	ids []string // in arrival order, for expiry
}

type answer struct {
	at   time.Time
	done chan struct{}
	o    outcome
}

// answerKeep bounds how long an answer is kept for a retry: longer than
// a client's patience.
const answerKeep = 2 * time.Minute

func newAnswers() *answers { return &answers{m: map[string]*answer{}} }

func (a *answers) do(id string, fn func() outcome) outcome {
	a.mu.Lock()
	now := time.Now()
	for len(a.ids) > 0 {
		if x := a.m[a.ids[0]]; x != nil && now.Sub(x.at) < answerKeep {
			break
		}
		delete(a.m, a.ids[0])
		a.ids = a.ids[1:]
	}
	if x, ok := a.m[id]; ok {
		a.mu.Unlock()
		<-x.done
		return x.o
	}
	x := &answer{at: now, done: make(chan struct{})}
	a.m[id] = x
	a.ids = append(a.ids, id)
	a.mu.Unlock()
	x.o = fn()
	if x.o.NotLeader {
		// Not run: a retry may find this replica leading.
		a.mu.Lock()
		delete(a.m, id)
		a.mu.Unlock()
	}
	close(x.done)
	return x.o
}
