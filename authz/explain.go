package authz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/policy"
)

// Explain is the dry run behind Policy.Explain and `nvmegate policy eval`:
// it evaluates input exactly as given — nothing is filled in or replaced,
// not even input.gateway — and returns the Decision the gateway would act
// on together with the raw decision document the policy produced (null if
// it produced none). The Decision applies the same fail-closed checks as
// Authorize, so a malformed allow shows as the deny it would be.
//
// For an action the policy decides in parts (split.go: access.connect and
// access.renew), the document also holds "parts": the scope decision's
// input, the scope decision, the caller decision and the node decision,
// as SplitPartsQuery composes them (the engine's self-test holds its own
// parts to that composition).
//
// With candidate modules (file name → Rego source), the serving bundle with
// those modules added or replaced is compiled and self-tested first, as
// Reload would; a candidate that Reload would refuse is an EINVALID error
// naming why, and nothing is swapped in.
func (e *Engine) Explain(ctx context.Context, input map[string]any, candidate map[string]string) (*nvmegate.Decision, []byte, error) {
	l := e.current.Load()
	if len(candidate) > 0 {
		c, err := e.candidate(ctx, l.bundle, candidate)
		if err != nil {
			return nil, nil, err
		}
		l = c
	}
	now := e.now()
	d := &nvmegate.Decision{ID: newDecisionID(now), PolicyRevision: l.status.Revision, EvaluatedAt: now}
	v, err := ast.InterfaceToValue(input)
	if err != nil {
		return nil, nil, nvmegate.Invalid("input_json", "cannot be a policy input: %v", err)
	}
	rs, err := l.query.Eval(ctx, rego.EvalParsedInput(v), rego.EvalTime(now))
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, nil, cerr
		}
		d.Reasons = []string{ReasonEvaluationFailed + ": " + err.Error()}
		return d, []byte("null"), nil
	}
	raw := []byte("null")
	if len(rs) > 0 && len(rs[0].Expressions) > 0 {
		if t, ok := rs[0].Expressions[0].Value.(*ast.Term); ok {
			if j, err := ast.JSON(t.Value); err == nil {
				if doc, ok := j.(map[string]any); ok && l.split != nil && l.split.actions[fmt.Sprint(input["action"])] {
					// A split action: the document shows its parts too.
					parts, err := l.split.parts(ctx, v, now)
					if err != nil {
						return nil, nil, err
					}
					doc["parts"] = parts
				}
				raw, _ = json.Marshal(j)
			}
		}
	}
	out, problem := parseResult(rs)
	if problem != nil {
		d.Reasons = []string{reasonMalformed + problem.Error()}
		return d, raw, nil
	}
	d.Allow, d.Reasons, d.Obligations = out.allow, out.reasons, out.obligations
	return d, raw, nil
}

// parts evaluates SplitPartsQuery over input (an explanation: not memoized).
func (s *split) parts(ctx context.Context, input ast.Value, now time.Time) (any, error) {
	rs, err := rego.New(rego.Query(SplitPartsQuery), rego.Compiler(s.comp), rego.Store(s.store),
		rego.SetRegoVersion(ast.RegoV1), rego.StrictBuiltinErrors(true), rego.Capabilities(capabilities),
		rego.ParsedInput(input), rego.Time(now)).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrEvaluation, SplitPartsQuery, err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, nil // the policy does not compose its parts
	}
	return rs[0].Expressions[0].Value, nil
}

// candidate prepares base with modules added or replaced.
func (e *Engine) candidate(ctx context.Context, base *policy.Bundle, modules map[string]string) (*loaded, error) {
	files := make(map[string][]byte, len(modules))
	for name, src := range modules {
		if path.Ext(name) != ".rego" || !fs.ValidPath(name) {
			return nil, nvmegate.Invalid("candidate_modules", "module names must be relative paths ending in .rego (got %q)", name)
		}
		files[name] = []byte(src)
	}
	b, err := base.With(files)
	if err != nil {
		return nil, nvmegate.Invalid("candidate_modules", "%v", err)
	}
	l, err := e.prepare(ctx, b, "candidate")
	var st *SelfTestError
	switch {
	case errors.As(err, &st):
		return nil, nvmegate.Invalid("candidate_modules", "the candidate fails self-test sample %q: %s", st.Sample, st.Problem)
	case err != nil:
		return nil, nvmegate.Invalid("candidate_modules", "%v", err)
	}
	return l, nil
}

// Candidate prepares a whole candidate policy — its files as a policy
// directory holds them: .rego modules, data.json, selftest.json — as a
// reload would (compiled and self-tested against the engine's gateway),
// without swapping it in, and returns an Authorizer that decides by it
// and its status. A policy impact decides the active grants by it.
func (e *Engine) Candidate(ctx context.Context, files map[string][]byte) (Authorizer, Status, error) {
	m := fstest.MapFS{}
	for name, data := range files {
		if !fs.ValidPath(name) {
			return nil, Status{}, nvmegate.Invalid("candidate_files", "file names must be relative paths (got %q)", name)
		}
		m[name] = &fstest.MapFile{Data: data, Mode: 0o444}
	}
	b, err := policy.Load(m)
	if err != nil {
		return nil, Status{}, nvmegate.Invalid("candidate_files", "%v", err)
	}
	l, err := e.prepare(ctx, b, "candidate")
	var st *SelfTestError
	switch {
	case errors.As(err, &st):
		return nil, Status{}, nvmegate.Invalid("candidate_files", "the candidate fails self-test sample %q: %s", st.Sample, st.Problem)
	case err != nil:
		return nil, Status{}, nvmegate.Invalid("candidate_files", "%v", err)
	}
	return AuthorizerFunc(func(ctx context.Context, in *Input) (*nvmegate.Decision, error) {
		d, _, err := e.decide(ctx, l, in, e.gateway, e.now())
		return d, err
	}), l.status, nil
}

// ComplianceQuery is the policy's compliance document (compliance.rego).
const ComplianceQuery = "data.nvmegate.authz.compliance"

// NamespaceCompliance is what the policy says of one namespace's state.
type NamespaceCompliance struct {
	// ResidencyProblems: where its placement breaks its region's
	// geo-fence; empty if it keeps to it.
	ResidencyProblems []string
	// RotateEvery is the rotation period its class declares for its keys;
	// 0 if none.
	RotateEvery time.Duration
	// ReencryptEvery is the age its class lets its data key reach before
	// a re-encryption rotates it; 0 if none.
	ReencryptEvery time.Duration
}

// Compliance evaluates the serving policy's compliance document for
// namespaces (each as policy sees a namespace: policy/README.md, with its
// target) and returns one verdict per namespace, in order, and the
// revision that gave them.
func (e *Engine) Compliance(ctx context.Context, namespaces []map[string]any) ([]NamespaceCompliance, string, error) {
	l := e.current.Load()
	if l.split == nil {
		return nil, l.status.Revision, fmt.Errorf("%w: revision %s composes no split decisions, and so no compliance document", ErrEvaluation, l.status.Revision)
	}
	nss := make([]any, len(namespaces))
	for i, n := range namespaces {
		nss[i] = n
	}
	in, err := ast.InterfaceToValue(map[string]any{"namespaces": nss})
	if err != nil {
		return nil, l.status.Revision, fmt.Errorf("%w: compliance input: %v", ErrEvaluation, err)
	}
	rs, err := rego.New(rego.Query(ComplianceQuery), rego.Compiler(l.split.comp), rego.Store(l.split.store),
		rego.SetRegoVersion(ast.RegoV1), rego.StrictBuiltinErrors(true), rego.Capabilities(capabilities),
		rego.ParsedInput(in), rego.Time(e.now())).Eval(ctx)
	if err != nil {
		return nil, l.status.Revision, fmt.Errorf("%w: %s: %v", ErrEvaluation, ComplianceQuery, err)
	}
	var doc struct {
		Namespaces []struct {
			ResidencyProblems []string `json:"residency_problems"`
			RotateEvery       string   `json:"rotate_every"`
			ReencryptEvery    string   `json:"reencrypt_every"`
		} `json:"namespaces"`
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return nil, l.status.Revision, fmt.Errorf("%w: %s is undefined in revision %s", ErrEvaluation, ComplianceQuery, l.status.Revision)
	}
	raw, err := json.Marshal(rs[0].Expressions[0].Value)
	if err == nil {
		err = json.Unmarshal(raw, &doc)
	}
	if err != nil || len(doc.Namespaces) != len(namespaces) {
		return nil, l.status.Revision, fmt.Errorf("%w: %s: malformed document (%v)", ErrEvaluation, ComplianceQuery, err)
	}
	out := make([]NamespaceCompliance, len(namespaces))
	for i, n := range doc.Namespaces {
		out[i].ResidencyProblems = n.ResidencyProblems
		if n.RotateEvery != "" {
			d, err := time.ParseDuration(n.RotateEvery)
			if err != nil || d <= 0 {
				return nil, l.status.Revision, fmt.Errorf("%w: %s: rotate_every %q is not a positive duration", ErrEvaluation, ComplianceQuery, n.RotateEvery)
			}
			out[i].RotateEvery = d
		}
		if n.ReencryptEvery != "" {
			d, err := time.ParseDuration(n.ReencryptEvery)
			if err != nil || d <= 0 {
				return nil, l.status.Revision, fmt.Errorf("%w: %s: reencrypt_every %q is not a positive duration", ErrEvaluation, ComplianceQuery, n.ReencryptEvery)
			}
			out[i].ReencryptEvery = d
		}
	}
	return out, l.status.Revision, nil
}
