package authz

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/policy"
)

// Authorizer decides one request. Every RPC passes through it (see
// UnaryServerInterceptor).
//
// Authorize returns a non-nil Decision whenever it can, also alongside an
// error, so that the caller can log and audit it. A request proceeds only if
// err is nil and Decision.Allow is true; an error means the decision could
// not be made (the request fails, it is not merely denied).
type Authorizer interface {
	Authorize(ctx context.Context, in *Input) (*nvmegate.Decision, error)
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, in *Input) (*nvmegate.Decision, error)

// Authorize calls f(ctx, in).
func (f AuthorizerFunc) Authorize(ctx context.Context, in *Input) (*nvmegate.Decision, error) {
	return f(ctx, in)
}

// DecisionQuery is the Rego document the engine evaluates.
const DecisionQuery = "data.nvmegate.authz.decision"

// SourceEmbedded is the Status.Source of the embedded default policy.
const SourceEmbedded = "embedded"

// Options configure an Engine. TrustDomain is required; the zero value of
// every other field is a sensible default.
type Options struct {
	// TrustDomain is the gateway's own SPIFFE trust domain, given to policy
	// as input.gateway.trust_domain. Required.
	TrustDomain spiffeid.TrustDomain
	// Bundle is the policy to serve, from policy.Load. Nil means the
	// embedded default (policy.Default()).
	Bundle *policy.Bundle
	// Source says where Bundle came from (a path, a bundle URL), for Status
	// and logs. Defaults to "embedded" when Bundle is nil, else "unspecified".
	Source string
	// Logger receives load events and evaluation failures. Nil discards.
	Logger *slog.Logger
	// Now is the clock: the decision time, input.time when the input has
	// none, and time.now_ns in Rego. Nil means time.Now.
	Now func() time.Time
}

// Status describes the policy revision an Engine is serving.
type Status struct {
	Revision  string    // policy.Bundle.Revision: the manifest's revision or the digest
	Digest    string    // policy.Bundle.Digest: changes with any file, whatever the manifest says
	Source    string    // Options.Source or the source given to Reload
	LoadedAt  time.Time // when it started serving
	Modules   []string  // names of the loaded Rego modules (tests excluded)
	DataFiles []string  // names of the loaded data.json files
}

// Engine is the OPA-backed Authorizer. It compiles a bundle's modules once,
// checks the bundle's self-test samples before serving it, and evaluates the
// prepared query per request. It is safe for concurrent use; Reload swaps
// the serving revision atomically, so an evaluation sees one revision from
// start to end and the decision names it.
type Engine struct {
	gateway Gateway
	log     *slog.Logger
	now     func() time.Time

	mu      sync.Mutex             // serializes Reload
	current atomic.Pointer[loaded] // never nil after NewEngine
	held    atomic.Pointer[error]  // Hold's reason; nil: deciding
	workers workers                // deep evaluations (workers.go)
}

// loaded is one prepared policy revision.
type loaded struct {
	query  rego.PreparedEvalQuery
	split  *split // the split decisions (split.go); nil if the policy has none
	status Status
	bundle *policy.Bundle // what was prepared; Explain builds candidates on it
}

// NewEngine compiles and self-tests the bundle of opts and returns an engine
// serving it. It fails with ErrConfig, ErrCompile, ErrData or a *SelfTestError
// (ErrSelfTest): a broken policy never serves.
func NewEngine(ctx context.Context, opts Options) (*Engine, error) {
	if opts.TrustDomain.IsZero() {
		return nil, fmt.Errorf("%w: trust domain is required", ErrConfig)
	}
	e := &Engine{
		gateway: Gateway{TrustDomain: opts.TrustDomain.Name()},
		log:     opts.Logger,
		now:     opts.Now,
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	b, src := opts.Bundle, opts.Source
	if b == nil {
		var err error
		if b, err = policy.Load(policy.Default()); err != nil {
			return nil, fmt.Errorf("authz: embedded policy: %w", err)
		}
		if src == "" {
			src = SourceEmbedded
		}
	}
	if src == "" {
		src = "unspecified"
	}
	if err := e.Reload(ctx, b, src); err != nil {
		return nil, err
	}
	return e, nil
}

// Reload compiles and self-tests b and, only if both succeed, makes it the
// serving revision; otherwise the previous revision keeps serving and the
// error (ErrCompile, ErrData, ErrSelfTest) says why. source is reported by Status.
// Evaluations in flight finish on the revision they started with.
func (e *Engine) Reload(ctx context.Context, b *policy.Bundle, source string) error {
	if b == nil {
		return fmt.Errorf("%w: no bundle", ErrConfig)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l, err := e.prepare(ctx, b, source)
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelError, "authz: policy refused",
			slog.String("revision", b.Revision), slog.String("source", source), slog.Any("error", err))
		return err
	}
	prev := e.current.Swap(l)
	e.held.Store(nil)
	attrs := []slog.Attr{slog.String("revision", b.Revision), slog.String("source", source),
		slog.Int("samples", len(b.Samples))}
	if prev != nil {
		attrs = append(attrs, slog.String("previous_revision", prev.status.Revision))
	}
	e.log.LogAttrs(ctx, slog.LevelInfo, "authz: policy loaded", attrs...)
	return nil
}

// Check compiles and self-tests b as Reload does, without serving it: a
// policy is checked before it is made the one in force for every replica
// (each then loads it with Reload).
func (e *Engine) Check(ctx context.Context, b *policy.Bundle, source string) error {
	if b == nil {
		return fmt.Errorf("%w: no bundle", ErrConfig)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, err := e.prepare(ctx, b, source)
	return err
}

// Hold stops the engine deciding until the next successful Reload: every
// Authorize denies and fails with ErrHeld, saying why. A replica holds its
// engine when it cannot load the policy in force for every replica: it
// must not decide under the one before.
func (e *Engine) Hold(why error) { e.held.Store(&why) }

// Status reports the serving revision.
func (e *Engine) Status() Status { return e.current.Load().status }

// capabilities are OPA's builtins minus those that reach the network: an
// authorization decision depends on its input and the bundle only, and can
// neither stall on nor leak to a remote endpoint.
var capabilities = func() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	denied := map[string]bool{"http.send": true, "net.lookup_ip_addr": true}
	bs := c.Builtins[:0:0]
	for _, b := range c.Builtins {
		if !denied[b.Name] {
			bs = append(bs, b)
		}
	}
	c.Builtins = bs
	return c
}()

// LoadCheckQuery is the document the engine evaluates once per revision,
// before the self-test, if the policy defines it:
//
//	{"problems": [...], "derived": {...}}
//
// Any problem (a malformed class, residency entry or role in the data)
// refuses the revision with ErrData. derived is stored at
// data.nvmegate.derived for the decisions of that revision: tables the
// policy computes from its data once instead of per request.
const LoadCheckQuery = "data.nvmegate.authz.load_check"

// regoOptions are the options of every query the engine prepares from b.
func regoOptions(b *policy.Bundle, query string, store storage.Store) []func(*rego.Rego) {
	opts := []func(*rego.Rego){
		rego.Query(query),
		rego.SetRegoVersion(ast.RegoV1),
		rego.Strict(true),
		rego.StrictBuiltinErrors(true),
		rego.Capabilities(capabilities),
		rego.GenerateJSON(termResult),
		rego.Store(store),
	}
	for _, m := range b.Modules {
		opts = append(opts, rego.Module(m.Name, m.Source))
	}
	return opts
}

// prepareData converts b's data to OPA values, runs the policy's load
// check on it and returns the read-only store the decisions of this
// revision read. The data is converted once, here: an evaluation reads the
// parts the policy refers to (data.nvmegate.roles[role], ...) without
// converting or copying, so the size of the data does not slow decisions.
func prepareData(ctx context.Context, b *policy.Bundle) (storage.Store, error) {
	data := b.Data
	if data == nil {
		data = map[string]any{}
	}
	v, err := ast.InterfaceToValue(data)
	if err != nil {
		return nil, fmt.Errorf("%w: revision %s: data: %v", ErrCompile, b.Revision, err)
	}
	root, ok := v.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("%w: revision %s: data is %s, not an object", ErrCompile, b.Revision, ast.ValueName(v))
	}
	rs, err := rego.New(regoOptions(b, LoadCheckQuery, inmem.NewFromASTObject(root))...).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	if len(rs) == 0 {
		return inmem.NewFromASTObject(root), nil // the policy defines no load check
	}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	res, ok := t.Value.(ast.Object)
	if !ok {
		return nil, fmt.Errorf("%w: revision %s: %s is not an object", ErrData, b.Revision, LoadCheckQuery)
	}
	var problems []string
	if p := res.Get(ast.StringTerm("problems")); p != nil {
		coll, ok := p.Value.(interface {
			Iter(func(*ast.Term) error) error
		})
		if !ok {
			return nil, fmt.Errorf("%w: revision %s: load_check.problems is not a collection", ErrData, b.Revision)
		}
		coll.Iter(func(x *ast.Term) error {
			if s, ok := x.Value.(ast.String); ok {
				problems = append(problems, string(s))
			} else {
				problems = append(problems, x.String())
			}
			return nil
		})
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return nil, fmt.Errorf("%w: revision %s: %s", ErrData, b.Revision, strings.Join(problems, "; "))
	}
	derived := res.Get(ast.StringTerm("derived"))
	if derived == nil {
		return inmem.NewFromASTObject(root), nil
	}
	// data.nvmegate.derived: a new nvmegate object in a new root, so that
	// nothing the first store holds changes.
	kNvmegate := ast.StringTerm("nvmegate")
	nv := ast.NewObject()
	if old := root.Get(kNvmegate); old != nil {
		o, ok := old.Value.(ast.Object)
		if !ok {
			return nil, fmt.Errorf("%w: revision %s: data.nvmegate is not an object", ErrData, b.Revision)
		}
		o.Foreach(func(k, v *ast.Term) { nv.Insert(k, v) })
	}
	nv.Insert(ast.StringTerm("derived"), derived)
	out := ast.NewObject()
	root.Foreach(func(k, v *ast.Term) {
		if !k.Equal(kNvmegate) {
			out.Insert(k, v)
		}
	})
	out.Insert(kNvmegate, ast.NewTerm(nv))
	return inmem.NewFromASTObject(out), nil
}

// prepare runs b's load check, compiles b (strict mode, Rego v1, builtin
// errors are evaluation errors) with b's data, and runs its self-test
// samples against the result.
func (e *Engine) prepare(ctx context.Context, b *policy.Bundle, source string) (*loaded, error) {
	store, err := prepareData(ctx, b)
	if err != nil {
		return nil, err
	}
	var comp *ast.Compiler // the compiled modules, shared by every query of the revision
	q, err := rego.New(append(regoOptions(b, DecisionQuery, store), rego.CompilerHook(func(c *ast.Compiler) { comp = c }))...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	l := &loaded{query: q, bundle: b, status: Status{Revision: b.Revision, Digest: b.Digest, Source: source, LoadedAt: e.now(), DataFiles: b.DataFiles}}
	for _, m := range b.Modules {
		l.status.Modules = append(l.status.Modules, m.Name)
	}
	// The data revision is the bundle's (its digest covers data.json); a
	// store with its own revision would pass it here, into the memo keys.
	if l.split, err = prepareSplit(ctx, b, comp, store, ""); err != nil {
		return nil, err
	}
	if err := e.selfTest(ctx, l, b); err != nil {
		return nil, err
	}
	if l.split != nil {
		l.split.reset()
	}
	return l, nil
}

// Authorize evaluates the policy for in. It fails closed: whatever goes
// wrong, the Decision denies and names the reason. Evaluation errors (and a
// nil in, or an input that cannot be converted) also return an error
// wrapping ErrEvaluation (ErrHeld while Hold holds it), or the context's
// error if ctx ended; a decision
// document of the wrong shape is a deny with reason "policy decision is
// malformed: ..." and no error (it is logged at error level: fix the policy).
//
// in.Gateway is ignored and replaced by the engine's own; a zero in.Time is
// the engine's clock. in is not modified.
func (e *Engine) Authorize(ctx context.Context, in *Input) (*nvmegate.Decision, error) {
	l := e.current.Load()
	now := e.now()
	if why := e.held.Load(); why != nil {
		d := &nvmegate.Decision{ID: newDecisionID(now), PolicyRevision: l.status.Revision, EvaluatedAt: now,
			Reasons: []string{"this replica cannot decide: " + (*why).Error()}}
		return d, fmt.Errorf("%w: %w", ErrHeld, *why)
	}
	d, _, err := e.decide(ctx, l, in, e.gateway, now)
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelError, "authz: policy evaluation failed",
			slog.String("decision_id", d.ID), slog.String("policy_revision", d.PolicyRevision),
			slog.String("method", method(in)), slog.Any("error", err))
	}
	return d, err
}

// decide evaluates in on revision l. It always returns a Decision; problem
// is set when the engine denied because the decision document was
// malformed, err when no decision could be made.
func (e *Engine) decide(ctx context.Context, l *loaded, in *Input, gw Gateway, now time.Time) (d *nvmegate.Decision, problem, err error) {
	d = &nvmegate.Decision{ID: newDecisionID(now), PolicyRevision: l.status.Revision, EvaluatedAt: now}
	if in == nil {
		d.Reasons = []string{ReasonNoInput}
		return d, nil, fmt.Errorf("%w: no input", ErrEvaluation)
	}
	if cerr := ctx.Err(); cerr != nil {
		// OPA notices cancellation only now and then; a call that is over
		// gets no decision to act on.
		d.Reasons = []string{ReasonCanceled}
		return d, nil, fmt.Errorf("authz: %w", cerr)
	}
	if action := actionOf(in); l.split != nil && l.split.actions[action] {
		return e.decideSplit(ctx, l, in, gw, now, action, d)
	}
	return e.evalFull(ctx, l, in, gw, now, d)
}

// actionOf is in's action, derived from the method if empty.
func actionOf(in *Input) string {
	if in.Action != "" {
		return in.Action
	}
	return ActionFromMethod(in.RPC.FullMethod)
}

// decideFull decides in by DecisionQuery, also for a split action.
func (e *Engine) decideFull(ctx context.Context, l *loaded, in *Input, gw Gateway, now time.Time) (*nvmegate.Decision, error, error) {
	d := &nvmegate.Decision{ID: newDecisionID(now), PolicyRevision: l.status.Revision, EvaluatedAt: now}
	return e.evalFull(ctx, l, in, gw, now, d)
}

// evalFull fills d by evaluating DecisionQuery.
func (e *Engine) evalFull(ctx context.Context, l *loaded, in *Input, gw Gateway, now time.Time, d *nvmegate.Decision) (*nvmegate.Decision, error, error) {
	v, err := in.value(gw, now)
	if err != nil {
		d.Reasons = []string{ReasonInputFailed}
		return d, nil, fmt.Errorf("%w: input: %v", ErrEvaluation, err)
	}
	var rs rego.ResultSet
	if werr := e.workers.do(ctx, func() { rs, err = l.query.Eval(ctx, rego.EvalParsedInput(v), rego.EvalTime(now)) }); werr != nil {
		err = werr
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			d.Reasons = []string{ReasonCanceled}
			return d, nil, fmt.Errorf("authz: %w", cerr)
		}
		d.Reasons = []string{ReasonEvaluationFailed}
		return d, nil, fmt.Errorf("%w: %v", ErrEvaluation, err)
	}
	out, problem := parseResult(rs)
	if problem != nil {
		d.Reasons = []string{reasonMalformed + problem.Error()}
		e.log.LogAttrs(ctx, slog.LevelError, "authz: malformed policy decision, denying",
			slog.String("decision_id", d.ID), slog.String("policy_revision", d.PolicyRevision),
			slog.String("method", in.RPC.FullMethod), slog.String("problem", problem.Error()))
		return d, problem, nil
	}
	d.Allow, d.Reasons, d.Obligations = out.allow, out.reasons, out.obligations
	return d, nil, nil
}

func method(in *Input) string {
	if in == nil {
		return ""
	}
	return in.RPC.FullMethod
}

var _ Authorizer = (*Engine)(nil)
