package authz

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/nvmegate/nvmegate/policy"
)

// selfTest evaluates every sample of b on the prepared revision l, the way
// Authorize does except that each sample brings its own input.gateway, and
// fails on the first sample decided differently or malformed.
func (e *Engine) selfTest(ctx context.Context, l *loaded, b *policy.Bundle) error {
	if len(b.Samples) == 0 { // policy.Load refuses this; a hand-built Bundle might not
		return &SelfTestError{Revision: b.Revision, Problem: "the bundle has no self-test samples"}
	}
	for _, s := range b.Samples {
		fail := func(problem string, reasons []string, err error) error {
			return &SelfTestError{Revision: b.Revision, Sample: s.Name, Problem: problem, Reasons: reasons, Err: err}
		}
		if s.Allow == nil {
			return fail("the sample has no expected outcome", nil, nil)
		}
		var in Input
		dec := json.NewDecoder(bytes.NewReader(s.Input))
		dec.DisallowUnknownFields()
		dec.UseNumber()
		if err := dec.Decode(&in); err != nil {
			return fail("the sample's input is not an input document", nil, err)
		}
		d, problem, err := e.decide(ctx, l, &in, in.Gateway, e.now())
		switch {
		case err != nil:
			return fail("evaluation failed", nil, err)
		case problem != nil:
			return fail(d.Reasons[0], nil, nil)
		case d.Allow != *s.Allow:
			return fail(fmt.Sprintf("got allow=%t, want allow=%t", d.Allow, *s.Allow), d.Reasons, nil)
		case s.Reasons != nil && !slices.Equal(d.Reasons, s.Reasons):
			return fail(fmt.Sprintf("got other reasons, want %q", s.Reasons), d.Reasons, nil)
		}
		// A split action's sample is decided by the engine's parts (their
		// inputs built in Go, split.go); DecisionQuery decides it by the
		// same parts with the inputs built in Rego. They must agree.
		if l.split != nil && l.split.actions[actionOf(&in)] {
			full, problem, err := e.decideFull(ctx, l, &in, in.Gateway, e.now())
			switch {
			case err != nil:
				return fail("evaluation of "+DecisionQuery+" failed", nil, err)
			case problem != nil:
				return fail(DecisionQuery+": "+full.Reasons[0], nil, nil)
			case full.Allow != d.Allow || !slices.Equal(full.Reasons, d.Reasons) || full.Obligations != d.Obligations:
				return fail(fmt.Sprintf("the split decision (allow=%t %q %+v) differs from %s (allow=%t %q %+v)",
					d.Allow, d.Reasons, d.Obligations, DecisionQuery, full.Allow, full.Reasons, full.Obligations), nil, nil)
			}
		}
	}
	return nil
}
