package gateway

import (
	"context"
	"errors"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/keys"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
	"github.com/nvmegate/nvmegate/store"
)

// KeyManager is what the Keys service needs of keys.Manager.
type KeyManager interface {
	Rotate(ctx context.Context, subsystem, reason string) (keys.Root, error)
	Status(ctx context.Context, subsystem string) (keys.RootStatus, error)
	Subsystems(ctx context.Context) ([]string, error)
	EnsureDataKey(ctx context.Context, namespace, owner string) error
	RotateDataKey(ctx context.Context, namespace, reason string) (keys.Wrapped, error)
	KEKVersions(ctx context.Context, namespace string) ([]keys.KEKVersion, error)
	Revoked(ctx context.Context, subsystemNQN, why string) error
	Credentials(ctx context.Context, hostNQN, subNQN string, p keys.CredentialParams) (keys.Credentials, error)
	// Usable is nil while root version v may still be used, ErrExpired
	// after its grace.
	Usable(ctx context.Context, subNQN string, v uint64) error
	DestroyDataKey(ctx context.Context, namespace, reason string) error
	BeginDataKeyRotation(ctx context.Context, namespace, reason string) (keys.Wrapped, error)
	DataKeyGeneration(ctx context.Context, namespace, owner string) (current, next uint64, err error)
	DataKeyOwner(ctx context.Context, namespace string) (owner string, found bool, err error)
}

// SubsystemGrants lists a subsystem's grants (*store.DB): a namespace is
// re-encrypted only while its subsystem has no active grant.
type SubsystemGrants interface {
	SubsystemGrants(ctx context.Context, subsystemNQN string) ([]*nvmegate.Grant, error)
}

// NamespaceKeyName names a namespace's data key in the key store.
func NamespaceKeyName(subsystemNQN string, nsid uint32) string {
	return nvmegate.NamespaceKey{SubsystemNQN: subsystemNQN, NSID: nsid}.KeyName()
}

// keysService answers Keys.Rotate and Keys.Status; it never returns key
// material. Rotations are recorded twice in the audit log: the request
// (with the decision) before, by the audit interceptor, and the new
// version with its fingerprint after, by the key manager's hook.
type keysService struct {
	pb.UnimplementedKeysServer
	keys  KeyManager
	store InventoryStore
	// reencrypter begins data-key rotations; nil: they are refused.
	reencrypter *reencrypter
}

// keyErr maps key-store errors to domain errors with caller-safe messages.
var keyErr = keys.CallerError

func (s *keysService) Rotate(ctx context.Context, r *pb.RotateRequest) (*pb.RotateResponse, error) {
	reason := "on demand"
	if r.Reason != "" {
		reason += ": " + r.Reason
	}
	switch r.Kind {
	case pb.KeyKind_KEY_KIND_ACCESS_ROOT:
		scope, err := s.scope(ctx, r.SubsystemNqn)
		if err != nil {
			return nil, err
		}
		root, err := s.keys.Rotate(ctx, scope, reason)
		if err != nil {
			return nil, keyErr(err)
		}
		// The rotation happened: a status that cannot be read now must not
		// turn it into a failure (the caller would rotate again).
		st, err := s.keys.Status(ctx, scope)
		if err != nil {
			st = keys.RootStatus{Current: root.Version,
				Versions: []keys.VersionStatus{{Version: root.Version, Created: root.Created, Fingerprint: keys.RootFingerprint(root)}}}
		}
		st.Subsystem = r.SubsystemNqn
		return &pb.RotateResponse{Status: rootStatus(st)}, nil
	default: // KEY_KIND_DATA_KEY (validated)
		n, err := s.store.Namespace(ctx, r.SubsystemNqn, r.Nsid)
		if err != nil {
			return nil, err
		}
		if r.Reencrypt {
			return s.reencrypt(ctx, n, reason)
		}
		name := NamespaceKeyName(r.SubsystemNqn, r.Nsid)
		// A namespace gets its data key on first use; rotating one that
		// has none yet makes it.
		if err := s.keys.EnsureDataKey(ctx, name, n.Incarnation); err != nil {
			return nil, keyErr(err)
		}
		w, err := s.keys.RotateDataKey(ctx, name, reason)
		if err != nil {
			return nil, keyErr(err)
		}
		st, err := s.dataKeyStatus(ctx, n)
		if err != nil {
			st = &pb.KeyStatus{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: r.SubsystemNqn, Nsid: r.Nsid, CurrentVersion: w.KEKVersion}
		}
		return &pb.RotateResponse{Status: st}, nil
	}
}

func (s *keysService) Status(ctx context.Context, r *pb.KeysStatusRequest) (*pb.KeysStatusResponse, error) {
	subs := []string{r.SubsystemNqn}
	if r.SubsystemNqn == "" {
		var err error
		if subs, err = s.allSubsystems(ctx); err != nil {
			return nil, err
		}
	} else if _, err := s.store.Subsystem(ctx, r.SubsystemNqn); err != nil {
		return nil, err
	}
	out := &pb.KeysStatusResponse{}
	for _, sub := range subs {
		if r.Kind != pb.KeyKind_KEY_KIND_DATA_KEY {
			scope, err := s.scope(ctx, sub)
			if err != nil {
				return nil, err
			}
			st, err := s.keys.Status(ctx, scope)
			if err != nil {
				return nil, keyErr(err)
			}
			st.Subsystem = sub
			if st.Current != 0 {
				out.Keys = append(out.Keys, rootStatus(st))
			}
		}
		if r.Kind != pb.KeyKind_KEY_KIND_ACCESS_ROOT {
			nss, err := s.namespaces(ctx, sub)
			if err != nil {
				return nil, err
			}
			for _, n := range nss {
				st, err := s.dataKeyStatus(ctx, n)
				if err != nil {
					return nil, err
				}
				if st.CurrentVersion != 0 {
					out.Keys = append(out.Keys, st)
				}
			}
		}
	}
	return out, nil
}

// scope is the credential root of a subsystem's grants: its own, or its
// nvmet target's (nvmegate.CredentialScope).
func (s *keysService) scope(ctx context.Context, subNQN string) (string, error) {
	sub, err := s.store.Subsystem(ctx, subNQN)
	if err != nil {
		return "", err
	}
	t, err := s.store.Target(ctx, sub.TargetID)
	if err != nil {
		return "", err
	}
	return nvmegate.CredentialScope(t, sub), nil
}

// allSubsystems lists the inventory's subsystems.
func (s *keysService) allSubsystems(ctx context.Context) ([]string, error) {
	subs, err := store.All(func(p store.Page) ([]*nvmegate.Subsystem, string, error) {
		return s.store.ListSubsystems(ctx, store.SubsystemFilter{}, p)
	})
	out := make([]string, 0, len(subs))
	for _, sub := range subs {
		out = append(out, sub.NQN)
	}
	return out, err
}

func (s *keysService) namespaces(ctx context.Context, sub string) ([]*nvmegate.Namespace, error) {
	return store.All(func(p store.Page) ([]*nvmegate.Namespace, string, error) {
		return s.store.ListNamespaces(ctx, store.NamespaceFilter{SubsystemNQN: sub}, p)
	})
}

// reencrypt begins a data-key rotation of namespace n and answers with
// its key's status (reencrypter.begin).
func (s *keysService) reencrypt(ctx context.Context, n *nvmegate.Namespace, reason string) (*pb.RotateResponse, error) {
	if s.reencrypter == nil {
		return nil, nvmegate.Errorf(nvmegate.EUNIMPLEMENTED, "this gateway programs no targets: it cannot re-encrypt")
	}
	if err := s.reencrypter.begin(ctx, n, reason); err != nil {
		return nil, err
	}
	st, err := s.dataKeyStatus(ctx, n)
	if err != nil {
		return nil, err
	}
	return &pb.RotateResponse{Status: st}, nil
}

// dataKeyStatus describes namespace n's data key. A key stored under its
// name for another record (one removed without erase) is not n's: n is
// described as having none yet.
func (s *keysService) dataKeyStatus(ctx context.Context, n *nvmegate.Namespace) (*pb.KeyStatus, error) {
	name := NamespaceKeyName(n.SubsystemNQN, n.NSID)
	st := &pb.KeyStatus{Kind: pb.KeyKind_KEY_KIND_DATA_KEY, SubsystemNqn: n.SubsystemNQN, Nsid: n.NSID}
	var err error
	st.DataKeyGeneration, st.ReencryptingTo, err = s.keys.DataKeyGeneration(ctx, name, n.Incarnation)
	if errors.Is(err, keys.ErrForeign) {
		return st, nil
	}
	if err != nil {
		return nil, keyErr(err)
	}
	vs, err := s.keys.KEKVersions(ctx, name)
	if err != nil {
		return nil, keyErr(err)
	}
	for i := len(vs) - 1; i >= 0; i-- {
		v := &pb.KeyVersion{Version: vs[i].Version, CreatedAt: ts(vs[i].Created)}
		if i < len(vs)-1 {
			v.SupersededAt = ts(vs[i+1].Created)
		}
		st.Versions = append(st.Versions, v)
	}
	if len(vs) > 0 {
		st.CurrentVersion = vs[len(vs)-1].Version
	}
	return st, nil
}

func rootStatus(st keys.RootStatus) *pb.KeyStatus {
	out := &pb.KeyStatus{Kind: pb.KeyKind_KEY_KIND_ACCESS_ROOT, SubsystemNqn: st.Subsystem, CurrentVersion: st.Current, NextRotation: ts(st.NextRotation)}
	for _, v := range st.Versions {
		out.Versions = append(out.Versions, &pb.KeyVersion{Version: v.Version, CreatedAt: ts(v.Created),
			SupersededAt: ts(v.Superseded), ValidUntil: ts(v.ValidUntil), Fingerprint: v.Fingerprint})
	}
	return out
}
