package authz

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/topdown"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/policy"
)

// Split decisions (DESIGN §4, "Decisions on the hot path are exact and
// cheap"; policy/connect.rego). For the actions a policy lists in
// split_actions (access.connect and access.renew in the default policy) the
// engine does not evaluate DecisionQuery but three parts:
//
//	scope decision   ScopeDecisionQuery over the scope input (the action and
//	                 the records of the job's scope: no caller, no time),
//	                 memoized by the SHA-256 of that input and the revisions;
//	caller decision  CallerDecisionQuery over the caller input (the request
//	                 without the time and without the namespaces and
//	                 subsystem, with the scope decision), memoized by the
//	                 SHA-256 of that input, the scope key and the revisions;
//	node decision    NodeDecisionQuery over the caller input with the time
//	                 and the caller decision, on every call: its document is
//	                 the decision, parsed and checked as DecisionQuery's.
//
// A memoized part is a pure function of its key: at load the engine refuses
// a policy whose scope or caller decision reaches a rule that reads input
// fields its input does not hold (input.caller and input.time for the
// scope, input.time for the caller) or calls a nondeterministic builtin.
// A key hashes everything the part's input holds, so a changed record or
// binding is a new key, and each revision has its own memos: an answer is
// reused only where it is exactly the answer.
//
// DecisionQuery decides the same actions by the same parts (the Rego
// projections of policy/connect.rego), for opa test, opa eval and
// Policy.Explain; the self-test holds the engine's parts to it.
const (
	SplitActionsQuery   = "data.nvmegate.authz.split_actions"
	ScopeDecisionQuery  = "data.nvmegate.authz.scope_decision"
	CallerDecisionQuery = "data.nvmegate.authz.caller_decision"
	NodeDecisionQuery   = "data.nvmegate.authz.node_decision"
	// SplitPartsQuery is what Explain shows of a split decision:
	// {"scope_input", "scope_decision", "caller_decision", "node_decision"}.
	SplitPartsQuery = "data.nvmegate.authz.split_parts"
)

// Memo bounds, per generation (see memo): a scope per job and subsystem in
// use, a caller entry per node, job and subsystem.
const (
	maxScopeEntries  = 4096
	maxCallerEntries = 16384
)

// Keys of the parts' inputs, beyond input.go's.
var (
	kScopeDecision  = ast.StringTerm("scope_decision")
	kCallerDecision = ast.StringTerm("caller_decision")
	kTimeNS         = ast.StringTerm("time_ns")
	kGrant          = ast.StringTerm("grant")
)

// The scope input: these resource keys as they are, and the job and the
// request narrowed to these keys (sorted, as canon.picked writes them).
var (
	scopeRecords   = []string{"namespaces", "subsystem", "target", "tenant"}
	scopeJobKeys   = []string{"allowed_regions", "job_id", "tenant"}
	scopeReqKeys   = []string{"mode"}
	callerExcluded = [2]string{"namespaces", "subsystem"}
)

// split is a revision's split decisions.
type split struct {
	actions       map[string]bool
	scope, caller rego.PreparedEvalQuery
	// The node decision is evaluated by topdown directly (see
	// evalNode): its compiled query, the revision's compiler and store,
	// a read transaction held for the revision's life (nothing writes a
	// revision's store) and a cancel never used (a node decision takes
	// microseconds; the call's context is checked before it starts).
	node      ast.Body
	comp      *ast.Compiler
	store     storage.Store
	txn       storage.Transaction
	cancel    topdown.Cancel
	scopeTag  []byte // key prefixes: part, revision, digest, data revision
	callerTag []byte

	scopes  *memo[*scopeEntry]
	callers *memo[*callerEntry]

	scopeEvals, callerEvals atomic.Uint64 // memo misses, for tests and metrics
}

type scopeEntry struct {
	key [32]byte
	doc *ast.Term // the scope decision document
}

type callerEntry struct {
	items [][2]*ast.Term // the caller input, to which a node input adds the time and doc
	doc   *ast.Term      // the caller decision
	// grant is the caller decision's grant document, if it has one, and
	// granted its parse: a node decision that returns it (the path of
	// every allowed call) is not parsed again.
	grant   ast.Value
	granted outcome
}

// nodeInput is the node input of e at time t (time_ns ns, nil for an
// invalid time): the caller input with the caller decision and the time.
// A new object each call: setting a key an OPA object already holds
// rehashes every value it holds, and a pooled input set twice per call
// cost more than building it (28% of a warm decision, pprof).
func (e *callerEntry) nodeInput(t, ns *ast.Term) ast.Object {
	items := make([][2]*ast.Term, len(e.items), len(e.items)+3)
	copy(items, e.items)
	items = append(items, [2]*ast.Term{kCallerDecision, e.doc}, [2]*ast.Term{kTime, t})
	if ns != nil {
		items = append(items, [2]*ast.Term{kTimeNS, ns})
	}
	return ast.NewObject(items...)
}

// prepareSplit prepares the split decisions of a revision whose policy
// lists split actions; it returns nil for one that does not. comp is the
// revision's compiler (modules compiled), store its data.
func prepareSplit(ctx context.Context, b *policy.Bundle, comp *ast.Compiler, store storage.Store, dataRevision string) (*split, error) {
	opts := func(query string) []func(*rego.Rego) {
		return []func(*rego.Rego){
			rego.Query(query), rego.Compiler(comp), rego.Store(store),
			rego.SetRegoVersion(ast.RegoV1), rego.Strict(true), rego.StrictBuiltinErrors(true),
			rego.Capabilities(capabilities), rego.GenerateJSON(termResult),
		}
	}
	rs, err := rego.New(opts(SplitActionsQuery)...).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: revision %s: %s: %v", ErrCompile, b.Revision, SplitActionsQuery, err)
	}
	if len(rs) == 0 {
		return nil, nil
	}
	actions := map[string]bool{}
	t, _ := rs[0].Expressions[0].Value.(*ast.Term)
	coll, ok := t.Value.(interface {
		Iter(func(*ast.Term) error) error
	})
	if !ok {
		return nil, fmt.Errorf("%w: revision %s: split_actions is not a set of actions", ErrCompile, b.Revision)
	}
	if err := coll.Iter(func(x *ast.Term) error {
		a, ok := x.Value.(ast.String)
		if !ok {
			return fmt.Errorf("split_actions holds %v, not an action", x)
		}
		actions[string(a)] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	// The memoized parts must be pure functions of their inputs.
	if err := checkPure(comp, ScopeDecisionQuery, "scope", map[string]bool{"action": true, "resource": true}); err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	if err := checkPure(comp, CallerDecisionQuery, "caller", map[string]bool{
		"caller": true, "rpc": true, "action": true, "resource": true, "gateway": true, "scope_decision": true,
	}); err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	s := &split{actions: actions, scopes: newMemo[*scopeEntry](maxScopeEntries), callers: newMemo[*callerEntry](maxCallerEntries)}
	for _, p := range []struct {
		q     *rego.PreparedEvalQuery
		query string
	}{{&s.scope, ScopeDecisionQuery}, {&s.caller, CallerDecisionQuery}} {
		if *p.q, err = rego.New(opts(p.query)...).PrepareForEval(ctx); err != nil {
			return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
		}
	}
	s.node, err = comp.QueryCompiler().WithStrict(true).Compile(ast.MustParseBody(nodeResult.String() + " = " + NodeDecisionQuery))
	if err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	s.comp, s.store, s.cancel = comp, store, topdown.NewCancel()
	if s.txn, err = store.NewTransaction(ctx); err != nil {
		return nil, fmt.Errorf("%w: revision %s: %v", ErrCompile, b.Revision, err)
	}
	tag := func(part string) []byte {
		var t []byte
		for _, f := range []string{"nvmegate/authz/" + part + "/v1", b.Revision, b.Digest, dataRevision} {
			t = binary.AppendUvarint(t, uint64(len(f)))
			t = append(t, f...)
		}
		return t
	}
	s.scopeTag, s.callerTag = tag("scope"), tag("caller")
	return s, nil
}

// reset empties the memos (after the self-test: its samples are not
// worth keeping).
func (s *split) reset() {
	s.scopes = newMemo[*scopeEntry](maxScopeEntries)
	s.callers = newMemo[*callerEntry](maxCallerEntries)
	s.scopeEvals.Store(0)
	s.callerEvals.Store(0)
}

// checkPure fails if a rule reachable from query reads an input field other
// than allowed or calls a nondeterministic builtin.
func checkPure(comp *ast.Compiler, query, part string, allowed map[string]bool) error {
	rules := comp.GetRulesExact(ast.MustParseRef(query))
	if len(rules) == 0 {
		return fmt.Errorf("the policy lists split_actions but does not define %s", query)
	}
	seen := map[*ast.Rule]bool{}
	queue := append([]*ast.Rule(nil), rules...)
	for len(queue) > 0 {
		r := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if r == nil || seen[r] {
			continue
		}
		seen[r] = true
		if what := impurity(r, allowed); what != "" {
			name := r.Head.Ref().String()
			if r.Module != nil && r.Module.Package != nil {
				name = strings.TrimPrefix(r.Module.Package.Path.String(), "data.") + "." + name
			}
			fields := make([]string, 0, len(allowed))
			for _, k := range []string{"caller", "rpc", "action", "resource", "gateway", "scope_decision"} {
				if allowed[k] {
					fields = append(fields, "input."+k)
				}
			}
			return fmt.Errorf("rule %s (%v) %s: the %s decision is memoized, so the rules it reaches may depend on %s and data only, not on the %s or any nondeterministic builtin; this check belongs in the node decision (policy/connect.rego)",
				name, r.Location, what, part, strings.Join(fields, ", "), map[string]string{"scope": "caller or the time", "caller": "time"}[part])
		}
		queue = append(queue, r.Else)
		for dep := range comp.Graph.Dependencies(r) {
			if d, ok := dep.(*ast.Rule); ok {
				queue = append(queue, d)
			}
		}
	}
	return nil
}

// impurity describes what makes rule r depend on more than allowed input
// fields and data, or "".
func impurity(r *ast.Rule, allowed map[string]bool) string {
	var what string
	call := func(ref ast.Ref) {
		if b := ast.BuiltinMap[ref.String()]; b != nil && b.Nondeterministic && what == "" {
			what = "calls " + ref.String() + " (nondeterministic)"
		}
	}
	ast.WalkExprs(r, func(x *ast.Expr) bool {
		if x.IsCall() {
			call(x.Operator())
		}
		return what != ""
	})
	ast.WalkTerms(r, func(t *ast.Term) bool {
		if what != "" {
			return true
		}
		switch v := t.Value.(type) {
		case ast.Call:
			if ref, ok := v[0].Value.(ast.Ref); ok {
				call(ref)
			}
		case ast.Ref:
			if !v[0].Equal(ast.InputRootDocument) {
				return false
			}
			if len(v) == 1 {
				what = "reads the whole input"
				return true
			}
			k, ok := v[1].Value.(ast.String)
			switch {
			case !ok:
				what = "reads input[" + v[1].String() + "]"
			case !allowed[string(k)]:
				what = "reads input." + string(k)
			}
		}
		return what != ""
	})
	return what
}

// decideSplit decides in by the split decisions of l. d is the decision to
// fill (ID, revision and time set); action is in's.
func (e *Engine) decideSplit(ctx context.Context, l *loaded, in *Input, gw Gateway, now time.Time, action string, d *nvmegate.Decision) (*nvmegate.Decision, error, error) {
	s := l.split
	c := getCanon()
	defer putCanon(c)

	// One key names the caller decision: the caller's input and the scope's
	// (on which its input.scope_decision depends). Only when it is not
	// memoized is the scope's own key needed.
	c.b = append(c.b, s.callerTag...)
	if in.Scope != nil {
		c.typedScope(action, in.Scope)
	} else if err := c.scopeInput(action, in.Resource); err != nil {
		d.Reasons = []string{ReasonInputFailed}
		return d, nil, fmt.Errorf("%w: input: %v", ErrEvaluation, err)
	}
	scopeEnd := len(c.b)
	if in.Scope != nil {
		c.typedCaller(in, action, gw, in.Scope)
	} else if err := c.callerInput(in, action, gw); err != nil {
		d.Reasons = []string{ReasonInputFailed}
		return d, nil, fmt.Errorf("%w: input: %v", ErrEvaluation, err)
	}
	callerKey := sha256.Sum256(c.b)
	ce, ok := s.callers.get(callerKey)
	if !ok {
		var (
			part         string
			problem, err error
		)
		if werr := e.workers.do(ctx, func() {
			ce, part, problem, err = s.decideCaller(ctx, in, action, gw, c.b[len(s.callerTag):scopeEnd], callerKey)
		}); werr != nil {
			part, err = "caller decision", werr
		}
		if err != nil || problem != nil {
			return e.failSplit(ctx, d, in, part, problem, err)
		}
	}

	// The node decision, over the caller's input with the time and the
	// caller decision.
	t := in.Time
	if t.IsZero() {
		t = now
	}
	ns, valid := timeNS(t)
	var nsTerm *ast.Term
	if valid {
		nsTerm = ast.NewTerm(ast.Number(strconv.FormatInt(ns, 10)))
	}
	input := ce.nodeInput(ast.StringTerm(t.UTC().Format(time.RFC3339Nano)), nsTerm)
	doc, err := s.evalNode(ctx, ast.NewTerm(input), now)
	if err != nil {
		return e.failSplit(ctx, d, in, "node decision", nil, err)
	}
	var problem error
	if doc == nil {
		problem = errors.New("decision is undefined")
	}
	var out outcome
	switch {
	case problem != nil:
	case ce.grant != nil && doc.Value == ce.grant: // the same document, already parsed
		out = ce.granted
		out.reasons = slices.Clone(out.reasons)
	default:
		out, problem = parseDecision(doc.Value)
	}
	if problem != nil {
		return e.failSplit(ctx, d, in, "node decision", problem, nil)
	}
	d.Allow, d.Reasons, d.Obligations = out.allow, out.reasons, out.obligations
	return d, nil, nil
}

// failSplit fills d for a part that failed: an evaluation error (err) or a
// malformed document (problem).
func (e *Engine) failSplit(ctx context.Context, d *nvmegate.Decision, in *Input, part string, problem, err error) (*nvmegate.Decision, error, error) {
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			d.Reasons = []string{ReasonCanceled}
			return d, nil, fmt.Errorf("authz: %w", cerr)
		}
		d.Reasons = []string{ReasonEvaluationFailed}
		return d, nil, fmt.Errorf("%w: %s: %v", ErrEvaluation, part, err)
	}
	problem = fmt.Errorf("%s: %w", part, problem)
	d.Reasons = []string{reasonMalformed + problem.Error()}
	e.log.LogAttrs(ctx, slog.LevelError, "authz: malformed policy decision, denying",
		slog.String("decision_id", d.ID), slog.String("policy_revision", d.PolicyRevision),
		slog.String("method", in.RPC.FullMethod), slog.String("problem", problem.Error()))
	return d, problem, nil
}

// noMetrics: node decisions are not timed (it would cost each an allocation).
var noMetrics = metrics.NoOp()

// nodeResult is the variable of the node decision's query.
var nodeResult = ast.Var("node_decision")

// evalNode evaluates the node decision over input: the prepared query of
// NodeDecisionQuery as rego would evaluate it (strict builtin errors,
// indexing, early exit, the time now), with what rego adds per evaluation
// (an evaluation context, metrics, a result set, a cancellation goroutine)
// left out, and with pooled caches (evalcache.go). It returns nil if the decision is undefined.
func (s *split) evalNode(ctx context.Context, input *ast.Term, now time.Time) (*ast.Term, error) {
	var doc *ast.Term
	cache := getEvalCache()
	defer cache.release()
	err := topdown.NewQuery(s.node).WithCompiler(s.comp).WithStore(s.store).WithTransaction(s.txn).
		WithInput(input).WithTime(now).WithCancel(s.cancel).WithIndexing(true).WithEarlyExit(true).
		WithStrictBuiltinErrors(true).WithMetrics(noMetrics).
		WithVirtualCache(cache).WithBaseCache((*baseCache)(cache)).
		Iter(ctx, func(qr topdown.QueryResult) error {
			if doc != nil {
				return errors.New("decision query returned several results")
			}
			doc = qr[nodeResult]
			return nil
		})
	return doc, err
}

// decideCaller decides the caller decision of callerKey, and the scope
// decision of the scope's canonical input (scopeIn) unless it is memoized;
// part names the part that failed.
func (s *split) decideCaller(ctx context.Context, in *Input, action string, gw Gateway, scopeIn []byte, callerKey [32]byte) (*callerEntry, string, error, error) {
	h := sha256.New()
	h.Write(s.scopeTag)
	h.Write(scopeIn)
	var scopeKey [32]byte
	h.Sum(scopeKey[:0])
	se, ok := s.scopes.get(scopeKey)
	if !ok {
		var problem, err error
		if se, problem, err = s.evalScope(ctx, action, in, scopeKey); err != nil || problem != nil {
			return nil, "scope decision", problem, err
		}
	}
	ce, problem, err := s.evalCaller(ctx, in, action, gw, se, callerKey)
	return ce, "caller decision", problem, err
}

// evalScope decides and memoizes the scope decision of key.
func (s *split) evalScope(ctx context.Context, action string, in *Input, key [32]byte) (*scopeEntry, error, error) {
	var v ast.Value
	if in.Scope != nil {
		v = typedScopeValue(action, in.Scope)
	} else {
		var err error
		if v, err = scopeInputValue(action, in.Resource); err != nil {
			return nil, nil, err
		}
	}
	rs, err := s.scope.Eval(ctx, rego.EvalParsedInput(v))
	if err != nil {
		return nil, nil, err
	}
	s.scopeEvals.Add(1)
	t, problem := resultTerm(rs)
	if problem == nil {
		_, problem = parseDecision(t.Value)
	}
	if problem != nil {
		return nil, problem, nil
	}
	se := &scopeEntry{key: key, doc: t}
	s.scopes.put(key, se)
	return se, nil, nil
}

// evalCaller decides and memoizes the caller decision of key.
func (s *split) evalCaller(ctx context.Context, in *Input, action string, gw Gateway, se *scopeEntry, key [32]byte) (*callerEntry, error, error) {
	items, err := callerInputItems(in, action, gw, se.doc)
	if err != nil {
		return nil, nil, err
	}
	rs, err := s.caller.Eval(ctx, rego.EvalParsedInput(ast.NewObject(items...)))
	if err != nil {
		return nil, nil, err
	}
	s.callerEvals.Add(1)
	t, problem := resultTerm(rs)
	ce := &callerEntry{items: items, doc: t}
	if problem == nil {
		obj, ok := t.Value.(ast.Object)
		if !ok {
			problem = fmt.Errorf("decision is %s, not an object", ast.ValueName(t.Value))
		} else if _, ok := value(obj, kAllow).(ast.Boolean); !ok {
			problem = errors.New("allow is missing or not a boolean")
		} else if g := obj.Get(kGrant); g != nil {
			if ce.granted, problem = parseDecision(g.Value); problem != nil {
				problem = fmt.Errorf("grant: %w", problem)
			}
			ce.grant = g.Value
		}
	}
	if problem != nil {
		return nil, problem, nil
	}
	s.callers.put(key, ce)
	return ce, nil, nil
}

// resultTerm is the one value of a decision query's result.
func resultTerm(rs rego.ResultSet) (*ast.Term, error) {
	if len(rs) == 0 {
		return nil, errors.New("decision is undefined")
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, errors.New("decision query returned several results")
	}
	t, ok := rs[0].Expressions[0].Value.(*ast.Term)
	if !ok {
		return nil, fmt.Errorf("unexpected result type %T", rs[0].Expressions[0].Value)
	}
	return t, nil
}

// timeNS is t in nanoseconds since the Unix epoch if policy/input.rego's
// valid_time accepts t's RFC 3339 form (years 1970 to 2261): then it is
// time.parse_rfc3339_ns of input.time, as node_input has it.
func timeNS(t time.Time) (int64, bool) {
	if y := t.UTC().Year(); y < 1970 || y > 2261 {
		return 0, false
	}
	return t.UnixNano(), true
}

// --- The parts' inputs (policy/connect.rego: scope_input, caller_input) ------

// scopeInput writes the scope input: the action, and per scope key of the
// resource, absent or its (narrowed) value.
func (c *canon) scopeInput(action string, res map[string]any) error {
	c.str(action)
	for _, k := range [...]string{"job", "namespaces", "request", "subsystem", "target", "tenant"} {
		v, ok := res[k]
		if !ok {
			c.tag(tAbsent)
			continue
		}
		c.tag(tPresent)
		var err error
		switch k {
		case "job":
			err = c.picked(v, scopeJobKeys)
		case "request":
			err = c.picked(v, scopeReqKeys)
		case "namespaces":
			err = c.valueOf(v, shapeNamespaces, "", "")
		case "subsystem":
			err = c.valueOf(v, shapeSubsystem, "", "")
		case "target":
			err = c.valueOf(v, shapeTarget, "", "")
		default:
			err = c.value(v)
		}
		if err != nil {
			return fmt.Errorf("resource.%s: %w", k, err)
		}
	}
	return nil
}

// callerInput writes the caller input but its scope decision (which the
// scope key names): the caller, the RPC, the action, the resource without
// the namespaces and subsystem, the gateway.
func (c *canon) callerInput(in *Input, action string, gw Gateway) error {
	c.identity(in, action, gw)
	if err := c.valueOf(in.Resource, shapeCallerResource, callerExcluded[0], callerExcluded[1]); err != nil {
		return fmt.Errorf("resource: %w", err)
	}
	return nil
}

// identity writes the caller input's fields but the resource and the
// scope decision: the caller, the RPC, the action, the gateway.
func (c *canon) identity(in *Input, action string, gw Gateway) {
	cl := &in.Caller
	for _, s := range [...]string{cl.ID, cl.TrustDomain, cl.Role, cl.Tenant, cl.Name,
		in.RPC.Service, in.RPC.Method, in.RPC.FullMethod, action, gw.TrustDomain} {
		c.str(s)
	}
}

// scopeInputValue is the scope input as an OPA value.
func scopeInputValue(action string, res map[string]any) (ast.Value, error) {
	tc := termCache{}
	r := ast.NewObject()
	for _, k := range scopeRecords {
		if v, ok := res[k]; ok {
			t, err := tc.term(v)
			if err != nil {
				return nil, fmt.Errorf("resource.%s: %w", k, err)
			}
			r.Insert(tc.str(k), t)
		}
	}
	for k, keys := range map[string][]string{"job": scopeJobKeys, "request": scopeReqKeys} {
		if v, ok := res[k]; ok {
			t, err := pick(v, keys)
			if err != nil {
				return nil, fmt.Errorf("resource.%s: %w", k, err)
			}
			r.Insert(tc.str(k), t)
		}
	}
	return ast.NewObject(
		ast.Item(kAction, ast.StringTerm(action)),
		ast.Item(kResource, ast.NewTerm(r)),
	), nil
}

// callerInputItems is the caller input as the items of an OPA object; its
// resource is the typed scope's if in has one.
func callerInputItems(in *Input, action string, gw Gateway, scope *ast.Term) ([][2]*ast.Term, error) {
	var res *ast.Term
	if in.Scope != nil {
		res = typedCallerResource(in.Scope)
	} else {
		tc := termCache{}
		kvs := make([][2]*ast.Term, 0, len(in.Resource))
		for k, v := range in.Resource {
			if k == callerExcluded[0] || k == callerExcluded[1] {
				continue
			}
			t, err := tc.term(v)
			if err != nil {
				return nil, fmt.Errorf("resource: %w", err)
			}
			kvs = append(kvs, [2]*ast.Term{tc.str(k), t})
		}
		res = ast.NewTerm(ast.NewObject(kvs...))
	}
	c := &in.Caller
	return [][2]*ast.Term{
		ast.Item(kCaller, callerTerm(c)),
		ast.Item(kRPC, rpcTerm(in.RPC)),
		ast.Item(kAction, ast.StringTerm(action)),
		ast.Item(kResource, res),
		ast.Item(kGateway, ast.NewTerm(ast.NewObject(ast.Item(kTrustDomain, ast.StringTerm(gw.TrustDomain))))),
		ast.Item(kScopeDecision, scope),
	}, nil
}
