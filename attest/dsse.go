package attest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	intoto "github.com/in-toto/attestation/go/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"google.golang.org/protobuf/encoding/protojson"
)

// StatementPayloadType is the DSSE payload type of an in-toto statement.
const StatementPayloadType = "application/vnd.in-toto+json"

// dsseSigner adapts a Signer to DSSE.
type dsseSigner struct{ s Signer }

func (d dsseSigner) Sign(ctx context.Context, data []byte) ([]byte, error) {
	return d.s.Sign(ctx, data)
}
func (d dsseSigner) KeyID() (string, error) { return d.s.PublicKey().KeyID(), nil }

// SignStatement wraps an in-toto statement in a DSSE envelope signed by s
// and returns the envelope's JSON.
func SignStatement(ctx context.Context, st *intoto.Statement, s Signer) ([]byte, error) {
	payload, err := protojson.Marshal(st)
	if err != nil {
		return nil, err
	}
	es, err := dsse.NewEnvelopeSigner(dsseSigner{s})
	if err != nil {
		return nil, err
	}
	env, err := es.SignPayload(ctx, StatementPayloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("sign statement: %w", err)
	}
	return json.MarshalIndent(env, "", "  ")
}

// OpenStatement checks a DSSE envelope offline: one of its signatures
// verifies under one of keys, and its payload is a valid in-toto statement
// of predicateType. It returns the statement and the key that signed it.
// Errors say what failed ("bad_signature: …" for the signature).
func OpenStatement(envJSON []byte, predicateType string, keys []PublicKey) (*intoto.Statement, *PublicKey, error) {
	var env dsse.Envelope
	if err := json.Unmarshal(envJSON, &env); err != nil {
		return nil, nil, fmt.Errorf("not a DSSE envelope: %w", err)
	}
	if env.PayloadType != StatementPayloadType {
		return nil, nil, fmt.Errorf("payload type %q, want %q", env.PayloadType, StatementPayloadType)
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return nil, nil, fmt.Errorf("payload: %w", err)
	}
	pae := dsse.PAE(env.PayloadType, payload)
	var signer *PublicKey
	for _, sig := range env.Signatures {
		raw, err := base64.StdEncoding.DecodeString(sig.Sig)
		if err != nil {
			continue
		}
		for i := range keys {
			if keys[i].Verify(pae, raw) == nil {
				signer = &keys[i]
				break
			}
		}
	}
	if signer == nil {
		return nil, nil, errors.New("bad_signature: no signature verifies under the given keys")
	}
	var st intoto.Statement
	if err := protojson.Unmarshal(payload, &st); err != nil {
		return nil, nil, fmt.Errorf("statement: %w", err)
	}
	if err := st.Validate(); err != nil || st.PredicateType != predicateType {
		return nil, nil, fmt.Errorf("not a %s statement (%v, %q)", predicateType, err, st.PredicateType)
	}
	return &st, signer, nil
}

// OpenPredicate is OpenStatement that also decodes the statement's
// predicate into v (a pointer to the predicate's Go type).
func OpenPredicate(envJSON []byte, predicateType string, keys []PublicKey, v any) (*intoto.Statement, *PublicKey, error) {
	st, signer, err := OpenStatement(envJSON, predicateType, keys)
	if err != nil {
		return nil, nil, err
	}
	raw, err := protojson.Marshal(st.Predicate)
	if err != nil {
		return nil, nil, fmt.Errorf("predicate: %w", err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, nil, fmt.Errorf("predicate: %w", err)
	}
	return st, signer, nil
}
