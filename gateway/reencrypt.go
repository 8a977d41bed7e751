package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
	"github.com/nvmegate/nvmegate/store"
)

// reencrypter begins data-key rotations by re-encryption, on demand
// (Keys.Rotate with reencrypt) and when a class's reencrypt_every is due
// (Server.ReencryptDue): one path for both.
type reencrypter struct {
	keys    KeyManager
	store   InventoryStore
	grants  SubsystemGrants
	targets TargetProgrammer
	now     func() time.Time
}

// busyError: the subsystem has active grants; a scheduled re-encryption
// waits for it to be idle. It answers callers as the error it wraps.
type busyError struct{ err *nvmegate.Error }

func (b busyError) Error() string { return b.err.Error() }
func (b busyError) Unwrap() error { return b.err }

// begin makes namespace n's next data key and has its target take the
// namespace offline and re-encrypt it. It returns once the target has
// applied that (the namespace is no longer exported); the re-encryption
// runs on, and the target's report of its end commits the rotation
// (targetAgentService.Reencrypted). Refused while the subsystem has an
// active grant, and for a namespace nvmegate does not encrypt.
func (r *reencrypter) begin(ctx context.Context, n *nvmegate.Namespace, reason string) error {
	sub, err := r.store.Subsystem(ctx, n.SubsystemNQN)
	if err != nil {
		return err
	}
	gs, err := r.grants.SubsystemGrants(ctx, n.SubsystemNQN)
	if err != nil {
		return err
	}
	active := 0
	for _, g := range gs {
		if g.Active(r.now()) {
			active++
		}
	}
	if active > 0 {
		return busyError{nvmegate.Errorf(nvmegate.ECONFLICT,
			"subsystem %s has %d active grant(s): re-encryption takes namespace %d offline; finish the jobs or revoke the grants first",
			n.SubsystemNQN, active, n.NSID)}
	}
	if n.BackingDevice == "" {
		return nvmegate.Errorf(nvmegate.ECONFLICT, "namespace %d of %s is not encrypted at rest by nvmegate (no backing device): there is nothing to re-encrypt", n.NSID, n.SubsystemNQN)
	}
	name := NamespaceKeyName(n.SubsystemNQN, n.NSID)
	if err := r.keys.EnsureDataKey(ctx, name, n.Incarnation); err != nil {
		return keyErr(err)
	}
	if _, err := r.keys.BeginDataKeyRotation(ctx, name, reason); err != nil {
		return keyErr(err)
	}
	r.targets.InventoryChanged(sub.TargetID)
	if err := r.targets.Program(ctx, sub.TargetID); err != nil {
		return nvmegate.Errorf(nvmegate.EUNAVAILABLE,
			"the re-encryption of namespace %d of %s is begun, but target %s has not confirmed taking it offline (%v); it starts when the target applies its state", n.NSID, n.SubsystemNQN, sub.TargetID, err)
	}
	return nil
}

// ReencryptDue begins the re-encryption of every namespace nvmegate
// encrypts whose data key is older than its class's reencrypt_every and
// whose subsystem has no active grant (one with grants waits: it is
// reported in waiting, and its compliance attestation says it is late).
// The daemon calls it periodically.
func (s *Server) ReencryptDue(ctx context.Context) (started, waiting int, err error) {
	if s.reencrypter == nil || s.compliancePolicy == nil {
		return 0, 0, nil
	}
	nss, err := store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
		return s.store.ListNamespaces(ctx, store.NamespaceFilter{}, p)
	})
	if err != nil {
		return 0, 0, err
	}
	d := &describer{ctx: ctx, store: s.store, jobs: s.jobs, members: &s.members, revisions: s.revisions}
	var enc []*nvmegate.Namespace
	var inputs []map[string]any
	for _, n := range nss {
		if n.BackingDevice == "" {
			continue
		}
		sub, err := d.subsystemRec(n.SubsystemNQN)
		if err != nil || sub == nil {
			continue
		}
		t, err := d.targetRec(sub.TargetID)
		if err != nil {
			continue
		}
		enc = append(enc, n)
		inputs = append(inputs, namespaceValueAt(n, "", t))
	}
	if len(enc) == 0 {
		return 0, 0, nil
	}
	verdicts, _, err := s.compliancePolicy.Compliance(ctx, inputs)
	if err != nil {
		return 0, 0, fmt.Errorf("re-encryption schedule: %w", err)
	}
	now := s.now()
	var errs []error
	for i, n := range enc {
		period := verdicts[i].ReencryptEvery
		if period <= 0 {
			continue
		}
		name := NamespaceKeyName(n.SubsystemNQN, n.NSID)
		vs, err := s.keys.KEKVersions(ctx, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(vs) == 0 || now.Sub(vs[0].Created) < period {
			continue // no data key yet (made at first use), or young enough
		}
		if _, next, err := s.keys.DataKeyGeneration(ctx, name, n.Incarnation); err != nil || next != 0 {
			if err != nil && !errors.Is(err, keys.ErrForeign) { // foreign: not n's key; n has none yet
				errs = append(errs, err)
			}
			continue // under way
		}
		err = s.reencrypter.begin(ctx, n, fmt.Sprintf("scheduled: data key older than its class's re-encryption period of %s", period))
		switch {
		case errors.As(err, new(busyError)):
			waiting++
		case err != nil:
			errs = append(errs, fmt.Errorf("namespace %d of %s: %w", n.NSID, n.SubsystemNQN, err))
		default:
			started++
		}
	}
	return started, waiting, errors.Join(errs...)
}
