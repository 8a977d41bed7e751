package loadgen

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"crypto/tls"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/identity"
	"github.com/nvmegate/nvmegate/identity/devca"
	"github.com/nvmegate/nvmegate/keys/nvmefmt"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// Options shape a run.
type Options struct {
	Nodes       int           // distinct node identities (N)
	Namespaces  int           // namespaces in the subsystem, all in every job's scope (M)
	Concurrency int           // connects in flight (C); Storm ignores it
	Duration    time.Duration // how long Run keeps going
	// Requests, if positive, ends Run after that many calls as well: a
	// run that must not outgrow a small disk cannot depend on how fast
	// the machine is.
	Requests int
	JobSize  int    // nodes per job (the scheduler admits N/JobSize jobs)
	Tenant   string // the tenant the scheduler identity belongs to
	Region   string
	RunID    string // names the target, subsystem, jobs and nodes; unique per run
	// Acks, if set, gets a line "<grant ID> <job> <audit index>" for every
	// acknowledged grant as it arrives (crash tests check them later with
	// ReadAcks and Verify).
	Acks io.Writer
	// Secrets, if set, gets the first SecretSample distinct DH-HMAC-CHAP
	// host secrets received, one per line — for leak tests, which look for
	// them where they must never be (the gateway's logs, its audit log).
	Secrets io.Writer
	// Call is what every node does; "" means CallConnect.
	Call Call
	// Rate, if positive, makes Run open-loop: calls start at this many
	// per second on a fixed schedule whatever the answers do, up to
	// MaxOpen in flight (more are counted as "Overloaded" errors), and
	// each latency is measured from the call's scheduled start, so that
	// a stall is not hidden by the calls it kept from starting.
	// Concurrency is then ignored.
	Rate float64
}

// MaxOpen bounds the calls in flight of an open-loop run.
const MaxOpen = 8192

// Call is what a node does in a run: the product's call, or one of its
// floors — the same nodes, identities and connections doing the least a
// call can do, measured in the same sitting so that a figure is quoted as a
// ratio to what the machine can do at all.
type Call string

const (
	// CallConnect is Access.Connect: policy, credentials, target
	// programming, a durable audit entry.
	CallConnect Call = "connect"
	// CallTrivial is grpc.health.v1 Health/Check on the floor server
	// (NewFloorServer, Fleet.UseFloor) over a connection of the node's
	// own: the floor of a unary call — what gRPC and mTLS cost with
	// nothing behind them.
	CallTrivial Call = "trivial"
	// CallHealth is grpc.health.v1 Health/Check on the gateway, over the
	// node's connection: a unary call through the gateway's interceptors,
	// a policy decision included (the default policy allows health to
	// every role, and decides it afresh for every call).
	CallHealth Call = "health"
	// CallHandshake is a new TLS 1.3 connection with the node's SVID to
	// the gateway, complete when the server's first bytes (its HTTP/2
	// settings, sent after it verified the client's certificate) arrive,
	// then closed: the floor of a storm, where every node's first call
	// pays a handshake. No gRPC call is made.
	CallHandshake Call = "handshake"
)

func (c Call) check() error {
	switch c {
	case "", CallConnect, CallTrivial, CallHealth, CallHandshake:
		return nil
	}
	return fmt.Errorf("loadgen: unknown call %q (connect, trivial, health or handshake)", string(c))
}

// SecretSample bounds what Options.Secrets gets: a leak scan searches for
// each secret in several forms through everything the run wrote.
const SecretSample = 16

// Env is how the run reaches the gateway.
type Env struct {
	Addr      string           // the gateway's gRPC address
	Admin     *grpc.ClientConn // an admin (inventory)
	Scheduler *grpc.ClientConn // the tenant's scheduler (jobs)
	Auditor   *grpc.ClientConn // an auditor (Verify)
	CA        *devca.CA        // mints the nodes' SVIDs
}

// Node is one simulated GPU node with its own connection.
type Node struct {
	ID    string // SPIFFE ID
	Job   string
	conn  *grpc.ClientConn
	floor *grpc.ClientConn                 // to the floor server (CallTrivial)
	creds credentials.TransportCredentials // conn's, for a new one (Storm)
	tls   *tls.Config                      // the connection's TLS configuration (CallHandshake)
	// addr and floorAddr are the node's own gateway and floor server
	// (Spread); "" means the fleet's.
	addr, floorAddr string
}

// gateway is the address of the gateway n connects to.
func (n *Node) gateway(f *Fleet) string {
	if n.addr != "" {
		return n.addr
	}
	return f.addr
}

// Fleet is what Setup made.
type Fleet struct {
	Subsystem string
	Jobs      []string
	Nodes     []*Node
	addr      string // the gateway's (CallHandshake dials it)
	floorAddr string // the floor server's (UseFloor)
}

// Close closes the nodes' connections.
func (f *Fleet) Close() {
	for _, n := range f.Nodes {
		if n.conn != nil {
			n.conn.Close()
		}
		if n.floor != nil {
			n.floor.Close()
		}
	}
}

// Ack is one acknowledged grant.
type Ack struct {
	GrantID    string
	Job        string
	AuditIndex uint64
}

// Result is what a run measured.
type Result struct {
	Call      Call
	Elapsed   time.Duration
	Latencies []time.Duration // of successful connects, sorted
	Errors    map[string]int  // by gRPC code
	Acks      []Ack
	// FirstErrors holds the first error of each code, with its message.
	FirstErrors []string
	// ClientCPU is the CPU time (user and system) this process spent during
	// the run: the client's share of the machine, when client and gateway
	// share it.
	ClientCPU time.Duration
}

// Rate is successful connects per second.
func (r *Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(len(r.Latencies)) / r.Elapsed.Seconds()
}

// Percentile returns the q-quantile (0..1) of the latencies.
func (r *Result) Percentile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Latencies))+0.5) - 1
	i = max(0, min(i, len(r.Latencies)-1))
	return r.Latencies[i]
}

// ErrorCount is the number of failed connects.
func (r *Result) ErrorCount() int {
	n := 0
	for _, c := range r.Errors {
		n += c
	}
	return n
}

func (o *Options) check() error {
	switch {
	case o.Nodes < 1:
		return errors.New("loadgen: --nodes must be at least 1")
	case o.Namespaces < 1 || o.Namespaces > 1024:
		return errors.New("loadgen: --namespaces must be 1..1024")
	case o.JobSize < 1:
		return errors.New("loadgen: --job-size must be at least 1")
	case o.RunID == "":
		return errors.New("loadgen: a run ID is required")
	}
	return o.Call.check()
}

// Setup registers the inventory, host bindings and jobs of a run, and
// mints every node's SVID and connection (connections are made lazily, at
// the first connect, so a storm includes the handshakes).
func Setup(ctx context.Context, env Env, o Options) (*Fleet, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	inv := pb.NewInventoryClient(env.Admin)
	target := "bench-" + o.RunID
	sub := "nqn.2026-01.io.nvmegate.bench:" + o.RunID
	if _, err := inv.AddTarget(ctx, &pb.AddTargetRequest{Target: &pb.Target{Id: target, Fabric: "fab-bench", Region: o.Region, Driver: "nvmet",
		Ports: []*pb.Port{{Id: 1, Transport: "tcp", AddressFamily: "ipv4", Address: "127.0.0.1", ServiceId: "4420"}}}}); err != nil {
		return nil, fmt.Errorf("add target: %w", err)
	}
	if _, err := inv.AddSubsystem(ctx, &pb.AddSubsystemRequest{Subsystem: &pb.Subsystem{Nqn: sub, TargetId: target, Tenant: o.Tenant,
		PortIds: []uint32{1}, Dhchap: true}}); err != nil {
		return nil, fmt.Errorf("add subsystem: %w", err)
	}
	scope := make([]*pb.JobNamespace, o.Namespaces)
	for i := range o.Namespaces {
		nsid := uint32(i + 1)
		name := fmt.Sprintf("bench/%s/%d", o.RunID, nsid)
		sum := sha256.Sum256([]byte(name))
		if _, err := inv.AddNamespace(ctx, &pb.AddNamespaceRequest{Namespace: &pb.Namespace{SubsystemNqn: sub, Nsid: nsid, Tenant: o.Tenant,
			Region: o.Region, DataClass: "internal", Dataset: &pb.Dataset{Name: name, Digest: "sha256:" + hex.EncodeToString(sum[:])}}}); err != nil {
			return nil, fmt.Errorf("add namespace %d: %w", nsid, err)
		}
		scope[i] = &pb.JobNamespace{SubsystemNqn: sub, Nsid: nsid, Mode: pb.AccessMode_ACCESS_MODE_READ_ONLY}
	}
	td := env.CA.TrustDomain()
	f := &Fleet{Subsystem: sub, Nodes: make([]*Node, o.Nodes)}
	for i := range f.Nodes {
		f.Nodes[i] = &Node{ID: fmt.Sprintf("spiffe://%s/node/bench-%s-%d", td.Name(), o.RunID, i)}
	}
	// Host bindings, a few at a time (each is one durable change and one
	// audit entry).
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, n := range f.Nodes {
		g.Go(func() error {
			nqn, err := nvmefmt.HostNQNFromSPIFFEID(n.ID)
			if err != nil {
				return err
			}
			_, err = inv.AddHostBinding(gctx, &pb.AddHostBindingRequest{Binding: &pb.HostBinding{SpiffeId: n.ID, HostNqn: nqn, Tenant: o.Tenant}})
			if err != nil {
				return fmt.Errorf("bind %s: %w", n.ID, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	jobs := pb.NewJobsClient(env.Scheduler)
	for start := 0; start < len(f.Nodes); start += o.JobSize {
		end := min(start+o.JobSize, len(f.Nodes))
		job := fmt.Sprintf("bench-%s-%d", o.RunID, len(f.Jobs))
		ids := make([]string, 0, end-start)
		for _, n := range f.Nodes[start:end] {
			n.Job = job
			ids = append(ids, n.ID)
		}
		if _, err := jobs.Admit(ctx, &pb.AdmitRequest{JobId: job, Tenant: o.Tenant, Nodes: ids, Namespaces: scope,
			AllowedRegions: []string{o.Region}, ExpiresAt: timestamppb.New(time.Now().Add(24 * time.Hour))}); err != nil {
			return nil, fmt.Errorf("admit %s: %w", job, err)
		}
		f.Jobs = append(f.Jobs, job)
	}
	// The nodes' SVIDs and connections.
	bundle := x509bundle.FromX509Authorities(td, []*x509.Certificate{env.CA.Certificate()})
	now := time.Now()
	for _, n := range f.Nodes {
		svid, err := env.CA.Issue(spiffeid.RequireFromString(n.ID), now.Add(-time.Minute), now.Add(24*time.Hour))
		if err != nil {
			return nil, err
		}
		src := identity.StaticSource(svid, bundle)
		n.creds = identity.ClientCredentials(src, identity.AuthorizeGateway(td))
		if n.conn, err = grpc.NewClient(env.Addr, grpc.WithTransportCredentials(n.creds)); err != nil {
			return nil, err
		}
		n.tls = identity.ClientTLSConfig(src, identity.AuthorizeGateway(td))
		n.tls.NextProtos = []string{"h2"} // gRPC servers refuse a TLS client that does not offer HTTP/2
	}
	f.addr = env.Addr
	return f, nil
}

// recorder collects outcomes from many goroutines.
type recorder struct {
	sink    io.Writer
	secrets io.Writer
	seen    map[string]bool // secrets written
	mu      sync.Mutex
	lat     []time.Duration
	errs    map[string]int
	acks    []Ack
	// firstErr is the first error of each code, for the report.
	firstErr []string
}

// connect makes one Connect attempt of node n and records it; it reports
// whether the node was granted. A call that the end of a sustained run
// (run, if non-nil) cut off is neither a success nor a failure.
func (r *recorder) connect(ctx, run context.Context, f *Fleet, n *Node, call Call) bool {
	return r.connectFrom(ctx, run, f, n, call, time.Now())
}

// connectFrom is connect with the latency measured from start (an
// open-loop call's scheduled start).
func (r *recorder) connectFrom(ctx, run context.Context, f *Fleet, n *Node, call Call, start time.Time) bool {
	var (
		resp *pb.ConnectResponse
		err  error
	)
	switch call {
	case CallHealth:
		_, err = healthpb.NewHealthClient(n.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	case CallTrivial:
		if n.floor == nil {
			err = status.Error(codes.FailedPrecondition, "no floor server (Fleet.UseFloor)")
			break
		}
		_, err = healthpb.NewHealthClient(n.floor).Check(ctx, &healthpb.HealthCheckRequest{})
	case CallHandshake:
		err = handshake(ctx, n.gateway(f), n.tls)
	default:
		resp, err = pb.NewAccessClient(n.conn).Connect(ctx, &pb.ConnectRequest{JobId: n.Job, SubsystemNqn: f.Subsystem})
	}
	d := time.Since(start)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if run != nil && ended(run) {
			return false
		}
		if r.errs == nil {
			r.errs = map[string]int{}
		}
		code := status.Code(err).String()
		if r.errs[code] == 0 {
			r.firstErr = append(r.firstErr, code+": "+status.Convert(err).Message())
		}
		r.errs[code]++
		return false
	}
	r.lat = append(r.lat, d)
	if resp == nil {
		return true // a floor call: nothing granted
	}
	a := Ack{GrantID: resp.Grant.GetGrantId(), Job: n.Job, AuditIndex: resp.Grant.GetAuditIndex()}
	r.acks = append(r.acks, a)
	if r.sink != nil {
		fmt.Fprintf(r.sink, "%s %s %d\n", a.GrantID, a.Job, a.AuditIndex)
	}
	if sec := resp.GetCredentials().GetDhchapHostSecret(); r.secrets != nil && sec != "" && len(r.seen) < SecretSample && !r.seen[sec] {
		if r.seen == nil {
			r.seen = map[string]bool{}
		}
		r.seen[sec] = true
		fmt.Fprintln(r.secrets, sec)
	}
	return true
}

// handshake opens a TLS connection to addr and waits for the server's
// first bytes: a gRPC server sends its HTTP/2 settings only once its side
// of the handshake, the client certificate's verification included, is
// done (a TLS 1.3 client's Handshake returns before that).
func handshake(ctx context.Context, addr string, cfg *tls.Config) error {
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	}
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		return status.Error(codes.Unavailable, "no server preface after the handshake: "+err.Error())
	}
	return nil
}

// ended reports whether the run's context is over. gRPC times a call out
// on its own timer from the context's deadline, which can fire a moment
// before the context's: a call cut off by the end of the run fails with
// DeadlineExceeded while ctx.Err() is still nil.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ReadAcks parses what Options.Acks received.
func ReadAcks(rd io.Reader) ([]Ack, error) {
	var out []Ack
	sc := bufio.NewScanner(rd)
	for line := 1; sc.Scan(); line++ {
		var a Ack
		if _, err := fmt.Sscanf(sc.Text(), "%s %s %d", &a.GrantID, &a.Job, &a.AuditIndex); err != nil {
			return nil, fmt.Errorf("acks line %d: %w", line, err)
		}
		out = append(out, a)
	}
	return out, sc.Err()
}

func (r *recorder) result(call Call, elapsed, cpu time.Duration) *Result {
	sort.Slice(r.lat, func(i, j int) bool { return r.lat[i] < r.lat[j] })
	if call == "" {
		call = CallConnect
	}
	return &Result{Call: call, Elapsed: elapsed, Latencies: r.lat, Errors: r.errs, Acks: r.acks, FirstErrors: r.firstErr, ClientCPU: cpu}
}

// Run keeps o.Concurrency connects in flight for o.Duration (or until
// o.Requests calls were made, if that is set), the nodes taking turns. Each connect supersedes that node's previous grant, so the
// target holds at most N hosts however long the run.
func Run(ctx context.Context, f *Fleet, o Options) *Result {
	if o.Call == CallTrivial && f.floorAddr != "" && f.Nodes[0].floor == nil {
		if err := f.UseFloor(f.floorAddr); err != nil {
			return &Result{Call: o.Call, Errors: map[string]int{"Internal": 1}, FirstErrors: []string{"Internal: " + err.Error()}}
		}
	}
	if o.Rate > 0 {
		// Every node's connection is up before the schedule starts: a
		// first call's handshake is not what an open-loop latency is of.
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		warm(wctx, f, o.Call)
		wcancel()
	}
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var (
		rec  = recorder{sink: o.Acks, secrets: o.Secrets}
		next atomic.Uint64
		wg   sync.WaitGroup
	)
	if o.Rate > 0 {
		start, cpu0 := time.Now(), processCPU()
		runOpen(ctx, f, o, &rec, start)
		return rec.result(o.Call, time.Since(start), processCPU()-cpu0)
	}
	start, cpu0 := time.Now(), processCPU()
	for range max(1, o.Concurrency) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !ended(ctx) {
				i := next.Add(1) - 1
				if o.Requests > 0 && i >= uint64(o.Requests) {
					return
				}
				n := f.Nodes[int(i)%len(f.Nodes)]
				rec.connect(ctx, ctx, f, n, o.Call)
			}
		}()
	}
	wg.Wait()
	return rec.result(o.Call, time.Since(start), processCPU()-cpu0)
}

// warm connects every node's connection for call, and waits (until ctx
// ends) for them to be ready.
func warm(ctx context.Context, f *Fleet, call Call) {
	var wg sync.WaitGroup
	for _, n := range f.Nodes {
		c := n.conn
		if call == CallTrivial {
			c = n.floor
		}
		if c == nil || call == CallHandshake {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Connect()
			for s := c.GetState(); s != connectivity.Ready && !ended(ctx); s = c.GetState() {
				c.WaitForStateChange(ctx, s)
			}
		}()
	}
	wg.Wait()
}

// runOpen starts calls at o.Rate per second from start until ctx ends
// (or o.Requests were started), and waits for those in flight.
func runOpen(ctx context.Context, f *Fleet, o Options, rec *recorder, start time.Time) {
	var (
		wg   sync.WaitGroup
		open atomic.Int64
	)
	interval := time.Duration(float64(time.Second) / o.Rate)
	for i := 0; o.Requests <= 0 || i < o.Requests; i++ {
		due := start.Add(time.Duration(i) * interval)
		if wait := time.Until(due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				wg.Wait()
				return
			case <-t.C:
			}
		} else if ended(ctx) {
			break
		}
		if open.Load() >= MaxOpen {
			rec.mu.Lock()
			if rec.errs == nil {
				rec.errs = map[string]int{}
			}
			if rec.errs["Overloaded"] == 0 {
				rec.firstErr = append(rec.firstErr, fmt.Sprintf("Overloaded: %d calls in flight", MaxOpen))
			}
			rec.errs["Overloaded"]++
			rec.mu.Unlock()
			continue
		}
		n := f.Nodes[i%len(f.Nodes)]
		open.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer open.Add(-1)
			rec.connectFrom(ctx, ctx, f, n, o.Call, due)
		}()
	}
	wg.Wait()
}

// Storm connects every node at once and reports when the last one was
// granted (Elapsed) — the cluster-start case. Each node does what a node
// agent does: an attempt that fails (the gateway refused it Unavailable,
// or it took longer than attempt) is retried after a short, jittered
// pause until the node is granted or the storm's timeout ends; failed
// attempts count as errors, and so does every node still not granted at
// the timeout ("NotGranted").
func Storm(ctx context.Context, f *Fleet, o Options, timeout, attempt time.Duration) *Result {
	// Every node on a connection of its own not yet made (a node that
	// starts): an earlier run on this fleet left its connections open.
	switch o.Call {
	case CallHandshake:
	case CallTrivial:
		if err := f.UseFloor(f.floorAddr); err != nil {
			return &Result{Call: o.Call, Errors: map[string]int{"Internal": 1}, FirstErrors: []string{"Internal: " + err.Error()}}
		}
		// Closed when the storm is done: 10,000 idle connections and
		// their clients would weigh on the storms after this one.
		defer f.closeFloor()
	default:
		for _, n := range f.Nodes {
			c, err := grpc.NewClient(n.gateway(f), grpc.WithTransportCredentials(n.creds))
			if err != nil {
				return &Result{Call: o.Call, Errors: map[string]int{"Internal": 1}, FirstErrors: []string{"Internal: " + err.Error()}}
			}
			n.conn.Close()
			n.conn = c
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var (
		rec = recorder{sink: o.Acks, secrets: o.Secrets}
		wg  sync.WaitGroup
	)
	start, cpu0 := time.Now(), processCPU()
	for i, n := range f.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for try := 0; ; try++ {
				actx, acancel := context.WithTimeout(ctx, attempt)
				ok := rec.connect(actx, nil, f, n, o.Call)
				acancel()
				if ok {
					return
				}
				pause := time.Duration(100+(i*37+try*53)%400) * time.Millisecond << min(try, 3)
				select {
				case <-ctx.Done():
					rec.mu.Lock()
					if rec.errs == nil {
						rec.errs = map[string]int{}
					}
					rec.errs["NotGranted"]++
					rec.mu.Unlock()
					return
				case <-time.After(pause):
				}
			}
		}()
	}
	wg.Wait()
	return rec.result(o.Call, time.Since(start), processCPU()-cpu0)
}

// processCPU is this process's CPU time so far (0 where unavailable).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Verify checks that every acknowledged grant has its grant entry in the
// audit log, at the index the gateway answered with. It returns the grant
// IDs that do not.
func Verify(ctx context.Context, env Env, acks []Ack) ([]string, error) {
	logged := map[string]uint64{}
	a := pb.NewAuditClient(env.Auditor)
	jobs := map[string]bool{}
	for _, k := range acks {
		jobs[k.Job] = true
	}
	for job := range jobs {
		token := ""
		for {
			resp, err := a.Query(ctx, &pb.QueryRequest{JobId: job, Kinds: []string{string(audit.EventGrant)}, PageSize: 1000, PageToken: token})
			if err != nil {
				return nil, fmt.Errorf("audit query: %w", err)
			}
			for _, e := range resp.Entries {
				d, err := audit.DecodeEntry(e.Entry)
				if err != nil {
					return nil, fmt.Errorf("audit entry %d: %w", e.Index, err)
				}
				logged[d.GrantID] = e.Index
			}
			if token = resp.NextPageToken; token == "" {
				break
			}
		}
	}
	var missing []string
	for _, k := range acks {
		if idx, ok := logged[k.GrantID]; !ok || idx != k.AuditIndex {
			missing = append(missing, k.GrantID)
		}
	}
	return missing, nil
}

// Ratio compares a connect run with its floor measured in the same sitting:
// rates and p99 for a sustained run, the time until the last node was
// done for a storm.
func Ratio(r, floor *Result, storm bool) string {
	if storm {
		return fmt.Sprintf("ratio      storm %s / %s floor %s = %.2fx\n", r.Elapsed.Round(time.Millisecond), floor.Call,
			floor.Elapsed.Round(time.Millisecond), r.Elapsed.Seconds()/max(floor.Elapsed.Seconds(), 1e-9))
	}
	return fmt.Sprintf("ratio      %.0f grants/s / %.0f %s calls/s = %.2f of the floor; p99 %s / %s = %.2fx\n",
		r.Rate(), floor.Rate(), floor.Call, r.Rate()/max(floor.Rate(), 1e-9),
		r.Percentile(0.99).Round(time.Microsecond), floor.Percentile(0.99).Round(time.Microsecond),
		float64(r.Percentile(0.99))/max(float64(floor.Percentile(0.99)), 1))
}

// Summary is a one-screen report of a result.
func Summary(r *Result) string {
	var b strings.Builder
	what := map[Call]string{CallTrivial: "calls", CallHealth: "calls", CallHandshake: "handshakes"}[r.Call]
	if what == "" {
		what = "grants"
	}
	fmt.Fprintf(&b, "%-10s %d in %s = %.0f %s/s\n", what, len(r.Latencies), r.Elapsed.Round(time.Millisecond), r.Rate(), what)
	fmt.Fprintf(&b, "latency    p50 %s  p90 %s  p99 %s  p99.9 %s  p99.99 %s  max %s\n",
		r.Percentile(0.5).Round(time.Microsecond), r.Percentile(0.9).Round(time.Microsecond), r.Percentile(0.99).Round(time.Microsecond),
		r.Percentile(0.999).Round(time.Microsecond), r.Percentile(0.9999).Round(time.Microsecond), r.Percentile(1).Round(time.Microsecond))
	fmt.Fprintf(&b, "errors     %d", r.ErrorCount())
	if len(r.Errors) > 0 {
		codes := make([]string, 0, len(r.Errors))
		for c, n := range r.Errors {
			codes = append(codes, fmt.Sprintf("%s=%d", c, n))
		}
		sort.Strings(codes)
		fmt.Fprintf(&b, " (%s)", strings.Join(codes, ", "))
		for _, e := range r.FirstErrors {
			fmt.Fprintf(&b, "\n           first %s", e)
		}
	}
	b.WriteString("\n")
	if r.ClientCPU > 0 && len(r.Latencies) > 0 {
		fmt.Fprintf(&b, "client cpu %s (%s per success)\n", r.ClientCPU.Round(time.Millisecond), (r.ClientCPU / time.Duration(len(r.Latencies))).Round(time.Microsecond))
	}
	return b.String()
}
