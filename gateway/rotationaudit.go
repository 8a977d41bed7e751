package gateway

import (
	"context"
	"fmt"
	"strings"

	"github.com/nvmegate/nvmegate/audit"
	"github.com/nvmegate/nvmegate/keys"
)

// AuditRotations is the key manager's OnRotate hook: each rotation, its
// intent before it and its outcome after, becomes a key_rotation entry of
// log, written by caller (the gateway's own ID). A rotation whose entry
// cannot be written does not happen: the manager gives up on an error.
func AuditRotations(log interface {
	Append(context.Context, audit.Entry) (uint64, [32]byte, error)
}, caller string) func(context.Context, keys.RotationEvent) error {
	return func(ctx context.Context, ev keys.RotationEvent) error {
		_, _, err := log.Append(ctx, audit.Entry{Kind: audit.EventKeyRotation, Caller: caller, Time: ev.Time,
			SubsystemNQN: subsystemOf(ev),
			Keys:         []audit.KeyRef{{Class: ev.Kind, ID: ev.Name, Version: ev.Version, Fingerprint: ev.Fingerprint}},
			Detail:       rotationDetail(ev)})
		return err
	}
}

// rotationDetail says what a rotation entry records: a rotation about to
// happen (written before it), or its outcome.
func rotationDetail(ev keys.RotationEvent) string {
	to := ""
	if ev.Version != 0 {
		to = fmt.Sprintf(" to v%d", ev.Version)
	}
	if ev.Kind == keys.KindDataKeyErase {
		switch ev.Outcome {
		case "":
			return fmt.Sprintf("data key of %s: destroying it and its KEK (crypto-erase; %s)", ev.Name, ev.Reason)
		case "applied":
			return fmt.Sprintf("data key of %s destroyed with its KEK (crypto-erase; %s)", ev.Name, ev.Reason)
		}
		return fmt.Sprintf("data key of %s: crypto-erase %s (%s)", ev.Name, ev.Outcome, ev.Reason)
	}
	if ev.Kind == keys.KindDataKeyReencrypt {
		switch ev.Outcome {
		case "":
			if ev.Version == 0 {
				return fmt.Sprintf("data key of %s: beginning its re-encryption to a new data key (%s)", ev.Name, ev.Reason)
			}
			return fmt.Sprintf("data key of %s: committing its re-encryption%s; the previous data key and its KEK are destroyed (%s)", ev.Name, to, ev.Reason)
		case "begun":
			return fmt.Sprintf("data key of %s: re-encryption%s begun, the namespace is offline until it ends (%s)", ev.Name, to, ev.Reason)
		case "applied":
			return fmt.Sprintf("data key of %s re-encrypted%s; the previous data key destroyed (%s)", ev.Name, to, ev.Reason)
		}
		return fmt.Sprintf("data key of %s: re-encryption%s %s (%s)", ev.Name, to, ev.Outcome, ev.Reason)
	}
	switch {
	case ev.Outcome == "":
		return fmt.Sprintf("%s of %s: rotating%s (%s)", ev.Kind, ev.Name, to, ev.Reason)
	case ev.Outcome == "applied":
		return fmt.Sprintf("%s of %s rotated%s (%s)", ev.Kind, ev.Name, to, ev.Reason)
	}
	return fmt.Sprintf("%s of %s: rotation%s %s (%s)", ev.Kind, ev.Name, to, ev.Outcome, ev.Reason)
}

// subsystemOf is the subsystem NQN of a rotated key: the name of a
// subsystem's root, none for a target's root, the part before the last "/"
// of a data key's "<NQN>/<NSID>".
func subsystemOf(ev keys.RotationEvent) string {
	if i := strings.LastIndexByte(ev.Name, '/'); (ev.Kind == "data_key" || ev.Kind == keys.KindDataKeyErase || ev.Kind == keys.KindDataKeyReencrypt) && i > 0 {
		return ev.Name[:i]
	}
	if strings.HasPrefix(ev.Name, "target:") {
		return "" // a target's root (nvmet): the key's ID names it
	}
	return ev.Name
}
