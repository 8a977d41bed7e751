package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/authz"
	"github.com/nvmegate/nvmegate/compliance"
	"github.com/nvmegate/nvmegate/cryptdev"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// CompliancePolicy is what a compliance attestation asks of the policy
// serving (*authz.Engine): its verdict on each namespace's state.
type CompliancePolicy interface {
	Compliance(ctx context.Context, namespaces []map[string]any) ([]authz.NamespaceCompliance, string, error)
}

// Attested is a compliance attestation made and recorded.
type Attested struct {
	Bundle    *compliance.Bundle
	Predicate *compliance.Predicate
}

// AttestCompliance states the fabric now (compliance.Predicate): every
// namespace with its placement, the policy's residency verdict and its
// keys' ages against its class's rotation period, every active grant
// decided again (a dry run of Redecide: what a re-decision would do), and
// what is out of compliance; anchors it to a checkpoint signed now, signs
// it with the log's key, records its digest in the log and returns it
// with the proof of that record. It fails (EUNIMPLEMENTED) on a gateway
// without a log signer, a key manager or a policy that states compliance.
func (s *Server) AttestCompliance(ctx context.Context) (*Attested, error) {
	if s.signer == nil || s.keys == nil || s.compliancePolicy == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway makes no compliance attestations: it needs a log signer, a key manager and a policy engine")
	}
	now := s.now()
	var rev uint64
	if s.revisions != nil {
		rev = s.revisions.ScopeRevision()
	}
	nss, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
		return s.store.ListNamespaces(ctx, store.NamespaceFilter{}, p)
	})
	if err != nil {
		return nil, err
	}
	d := &describer{ctx: ctx, store: s.store, jobs: s.jobs, members: &s.members, revisions: s.revisions}
	inputs := make([]map[string]any, len(nss))
	placed := make([]*nvmegate.Target, len(nss))
	subs := make([]*nvmegate.Subsystem, len(nss))
	for i, n := range nss {
		if subs[i], err = d.subsystemRec(n.SubsystemNQN); err != nil {
			return nil, err
		}
		if subs[i] != nil {
			if placed[i], err = d.targetRec(subs[i].TargetID); err != nil {
				return nil, err
			}
		}
		inputs[i] = namespaceValueAt(n, "", placed[i])
	}
	verdicts, polRev, err := s.compliancePolicy.Compliance(ctx, inputs)
	if err != nil {
		return nil, fmt.Errorf("compliance: %w", err)
	}
	p := &compliance.Predicate{Time: now.UTC(), PolicyRevision: polRev}
	var out []string
	tenants := map[string]*compliance.Tenant{}
	for i, n := range nss {
		ns := compliance.Namespace{SubsystemNQN: n.SubsystemNQN, NSID: n.NSID, Region: n.Region, DataClass: n.DataClass,
			Dataset: n.Dataset.Name, DatasetDigest: n.Dataset.Digest,
			Residency: compliance.Verdict{OK: len(verdicts[i].ResidencyProblems) == 0, Problems: verdicts[i].ResidencyProblems}}
		label := fmt.Sprintf("namespace %s/%d", n.SubsystemNQN, n.NSID)
		out = append(out, verdicts[i].ResidencyProblems...)
		period := verdicts[i].RotateEvery
		if period > 0 {
			ns.RotateEvery = period.String()
		}
		if t := placed[i]; t != nil {
			ns.Target, ns.TargetRegion, ns.Fabric = t.ID, t.Region, t.Fabric
			scope := nvmegate.CredentialScope(t, subs[i])
			if ns.AccessRoot, err = s.rootAge(ctx, scope, period, now); err != nil {
				return nil, err
			}
			if !ns.AccessRoot.WithinPeriod {
				out = append(out, fmt.Sprintf("%s: access root %s v%d is %s old, past its class's rotation period of %s", label, scope, ns.AccessRoot.Version,
					time.Duration(ns.AccessRoot.AgeSeconds)*time.Second, period))
			}
		} else {
			out = append(out, label+": its subsystem or target is not in the inventory")
		}
		if ns.KEK, err = s.kekAge(ctx, NamespaceKeyName(n.SubsystemNQN, n.NSID), period, now); err != nil {
			return nil, err
		}
		switch {
		case ns.KEK.Version == 0:
			// No data key yet: a namespace gets one on first use
			// (keys rotate --data-key); version 0 says so.
		case !ns.KEK.WithinPeriod:
			out = append(out, fmt.Sprintf("%s: key-encryption key v%d is %s old, past its class's rotation period of %s", label, ns.KEK.Version,
				time.Duration(ns.KEK.AgeSeconds)*time.Second, period))
		}
		if ns.AtRest, err = s.atRest(ctx, n, verdicts[i].ReencryptEvery, now); err != nil {
			return nil, err
		}
		if ns.AtRest.Encrypted && !ns.AtRest.DataKey.WithinPeriod {
			out = append(out, fmt.Sprintf("%s: data key generation %d is %s old, past its class's re-encryption period of %s", label, ns.AtRest.DataKey.Version,
				time.Duration(ns.AtRest.DataKey.AgeSeconds)*time.Second, verdicts[i].ReencryptEvery))
		}
		t := tenants[n.Tenant]
		if t == nil {
			t = &compliance.Tenant{Name: n.Tenant}
			tenants[n.Tenant] = t
		}
		t.Namespaces = append(t.Namespaces, ns)
	}
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		p.Tenants = append(p.Tenants, *tenants[name])
	}
	// The active grants, decided again under the policy serving.
	if s.lease != nil {
		red, err := s.Redecide(ctx, Change{All: true, Cause: "compliance attestation"}, nil, true)
		if err != nil {
			return nil, err
		}
		for _, v := range red.Decided {
			g := v.Grant
			cg := compliance.Grant{Verdict: "allowed"}
			switch {
			case v.Ends():
				cg = compliance.Grant{Verdict: "revoke", Reasons: v.Reasons()}
			case len(v.Shortfalls) > 0:
				cg = compliance.Grant{Verdict: "must_renew", Reasons: v.Reasons()}
			}
			cg.ID, cg.Job, cg.Tenant, cg.Node, cg.SubsystemNQN, cg.ExpiresAt, cg.ReauthBy = g.ID, g.JobID, g.Tenant, g.Node, g.SubsystemNQN, g.ExpiresAt, g.ReauthBy
			p.Grants = append(p.Grants, cg)
			if cg.Verdict != "allowed" {
				out = append(out, fmt.Sprintf("grant %s (job %s, node %s): %s: %s", g.ID, g.JobID, g.Node, cg.Verdict, joinReasons(cg.Reasons)))
			}
		}
	}
	if s.revisions != nil && s.revisions.ScopeRevision() == rev {
		p.DataRevision = rev
	}
	p.OutOfCompliance = out
	if p.OutOfCompliance == nil {
		p.OutOfCompliance = []string{}
	}
	cp, err := s.audit.Checkpoint(ctx)
	if err != nil {
		return nil, fmt.Errorf("compliance: anchor checkpoint: %w", err)
	}
	st, err := compliance.Statement(p, cp)
	if err != nil {
		return nil, err
	}
	b, err := compliance.Record(ctx, s.audit, st, s.signer, cp.Size, s.self)
	if err != nil {
		return nil, nvmegate.Errorf(nvmegate.EUNAVAILABLE, "compliance attestation not recorded: %v", err)
	}
	s.lastAttestation.Store(now.Unix())
	s.outOfCompliance.Store(int64(len(out)))
	oldest := map[[2]string]int64{}
	for _, t := range p.Tenants {
		for _, n := range t.Namespaces {
			for key, ka := range map[string]compliance.KeyAge{"access_root": n.AccessRoot, "kek": n.KEK} {
				k := [2]string{n.DataClass, key}
				oldest[k] = max(oldest[k], ka.AgeSeconds)
			}
		}
	}
	s.metrics.keyAge.Reset()
	for k, v := range oldest {
		s.metrics.keyAge.WithLabelValues(k[0], k[1]).Set(float64(v))
	}
	return &Attested{Bundle: b, Predicate: p}, nil
}

// registerComplianceMetrics exports the compliance gauges to reg.
func (s *Server) registerComplianceMetrics(reg prometheus.Registerer) error {
	started := s.now()
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "nvmegate", Name: "compliance_attestation_age_seconds",
			Help: "Seconds since the last compliance attestation (since the gateway started, if none yet).",
		}, func() float64 {
			last := time.Unix(s.lastAttestation.Load(), 0)
			if s.lastAttestation.Load() == 0 {
				last = started
			}
			return s.now().Sub(last).Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "nvmegate", Name: "compliance_findings",
			Help: "What the last compliance attestation named out of compliance (residency, key ages, grants).",
		}, func() float64 { return float64(s.outOfCompliance.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "nvmegate", Name: "grants_out_of_compliance",
			Help: "Active grants a change obliged to renew (under obligations they were not issued under) that have not yet.",
		}, func() float64 {
			if s.lease == nil {
				return 0
			}
			gs, err := s.lease.ActiveGrants(context.Background())
			if err != nil {
				return -1
			}
			n := 0
			for _, g := range gs {
				if !g.ReauthBy.IsZero() {
					n++
				}
			}
			return float64(n)
		}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func joinReasons(rs []string) string {
	if len(rs) == 0 {
		return "no reason given"
	}
	return strings.Join(rs, "; ")
}

// minAttestationInterval is how long a caller of Audit.Compliance is given
// the last attestation rather than a new one: each is a full pass over the
// inventory, a signature and a log entry, and a caller in a loop must not
// turn that into load or log growth.
const minAttestationInterval = time.Minute

// recentAttestation returns the last attestation if it is younger than
// minAttestationInterval, else makes a new one. Concurrent callers share
// one.
func (s *Server) recentAttestation(ctx context.Context) (*Attested, error) {
	s.attestMu.Lock()
	defer s.attestMu.Unlock()
	if a := s.lastAttested; a != nil && s.now().Sub(a.Predicate.Time) < minAttestationInterval {
		return a, nil
	}
	a, err := s.AttestCompliance(ctx)
	if err != nil {
		return nil, err
	}
	s.lastAttested = a
	return a, nil
}

// rootAge is the age of scope's current access root against period.
func (s *Server) rootAge(ctx context.Context, scope string, period time.Duration, now time.Time) (compliance.KeyAge, error) {
	ka := compliance.KeyAge{Name: scope, WithinPeriod: true}
	st, err := s.keys.Status(ctx, scope)
	if errors.Is(err, keys.ErrNotFound) || nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
		return ka, nil // no root yet: nothing issued, nothing to rotate
	}
	if err != nil {
		return ka, err
	}
	for _, v := range st.Versions {
		if v.Version == st.Current {
			ka.Version, ka.CreatedAt = v.Version, v.Created.UTC()
		}
	}
	age(&ka, period, now)
	return ka, nil
}

// kekAge is the age of a namespace's current key-encryption key.
func (s *Server) kekAge(ctx context.Context, name string, period time.Duration, now time.Time) (compliance.KeyAge, error) {
	ka := compliance.KeyAge{Name: name, WithinPeriod: true}
	vs, err := s.keys.KEKVersions(ctx, name)
	if errors.Is(err, keys.ErrNotFound) || nvmegate.ErrorCode(err) == nvmegate.ENOTFOUND {
		return ka, nil
	}
	if err != nil {
		return ka, err
	}
	for _, v := range vs {
		if v.Version > ka.Version {
			ka.Version, ka.CreatedAt = v.Version, v.Created.UTC()
		}
	}
	age(&ka, period, now)
	return ka, nil
}

// atRest says how namespace n is encrypted at rest and how old its data
// key is: a data key never changes under a KEK rotation, and each
// generation has a KEK of its own, so it is as old as its KEK's first
// version. period is the age its class allows (0: none).
func (s *Server) atRest(ctx context.Context, n *nvmegate.Namespace, period time.Duration, now time.Time) (compliance.AtRest, error) {
	name := NamespaceKeyName(n.SubsystemNQN, n.NSID)
	ar := compliance.AtRest{Encrypted: n.BackingDevice != "", BackingDevice: n.BackingDevice, DataKey: compliance.KeyAge{Name: name, WithinPeriod: true}}
	if ar.Encrypted {
		ar.Cipher = cryptdev.Cipher
		if period > 0 {
			ar.ReencryptEvery = period.String()
		}
	}
	// A key stored under the name for another record (a namespace removed
	// without erase) is not n's: n has none yet, and its age is not n's.
	gen, _, err := s.keys.DataKeyGeneration(ctx, name, n.Incarnation)
	if errors.Is(err, keys.ErrForeign) {
		return ar, nil
	}
	if err != nil {
		return ar, err
	}
	vs, err := s.keys.KEKVersions(ctx, name)
	if err != nil && !errors.Is(err, keys.ErrNotFound) && nvmegate.ErrorCode(err) != nvmegate.ENOTFOUND {
		return ar, err
	}
	if len(vs) > 0 {
		ar.DataKey.Version, ar.DataKey.CreatedAt = max(gen, 1), vs[0].Created.UTC()
		if ar.Encrypted {
			age(&ar.DataKey, period, now)
		} else {
			age(&ar.DataKey, 0, now)
		}
	}
	return ar, nil
}

func age(ka *compliance.KeyAge, period time.Duration, now time.Time) {
	if ka.CreatedAt.IsZero() {
		return
	}
	a := now.Sub(ka.CreatedAt)
	ka.AgeSeconds = int64(a / time.Second)
	ka.WithinPeriod = period <= 0 || a <= period
}
