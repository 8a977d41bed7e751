package csidriver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func (n *Node) statePath(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(n.StateDir, hex.EncodeToString(sum[:16])+".json")
}

// save writes st's state file (atomically: a crash leaves the old or the
// new one).
func (n *Node) save(st *staged) error {
	if n.StateDir == "" {
		return nil
	}
	n.mu.Lock()
	b, err := json.Marshal(st)
	n.mu.Unlock()
	if err == nil {
		err = os.MkdirAll(n.StateDir, 0o700)
	}
	if err == nil {
		p := n.statePath(st.VolumeID)
		err = os.WriteFile(p+".tmp", b, 0o600)
		if err == nil {
			err = os.Rename(p+".tmp", p)
		}
	}
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: state: %v", st.vol.Handle(), err)
	}
	return nil
}

// Resume takes back the volumes a previous run of the plugin staged. It
// loads them and claims each before the plugin serves, so that a CO's
// call for one waits (Aborted, retried) instead of finding it unknown;
// run, in the background, connects each again (the agent takes over the
// controller still there, with a new grant) and keeps trying one that
// fails every RetryEvery until it is back or the CO unstages it.
func (n *Node) Resume(ctx context.Context) (run func(), err error) {
	ents, err := os.ReadDir(n.StateDir)
	if errors.Is(err, os.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	var sts []*staged
	releases := map[string]func(){}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(n.StateDir, e.Name()))
		if err != nil {
			return nil, err
		}
		st := &staged{}
		if err := json.Unmarshal(b, st); err != nil {
			n.log().Error("a state file that does not parse is left", "file", e.Name(), "err", err)
			continue
		}
		if st.vol, err = ParseHandle(st.VolumeID); err != nil || n.statePath(st.VolumeID) != filepath.Join(n.StateDir, e.Name()) {
			n.log().Error("a state file that does not name its volume is left", "file", e.Name(), "err", err)
			continue
		}
		done, err := n.claim(st.VolumeID)
		if err != nil {
			continue
		}
		n.mu.Lock()
		if n.volumes == nil {
			n.volumes = map[string]*staged{}
		}
		n.volumes[st.VolumeID] = st
		n.mu.Unlock()
		sts = append(sts, st)
		releases[st.VolumeID] = done
	}
	return func() { n.resume(ctx, sts, releases) }, nil
}

// RetryEvery is how often a volume that could not be taken back is tried
// again.
var RetryEvery = 10 * time.Second

func (n *Node) resume(ctx context.Context, sts []*staged, releases map[string]func()) {
	for len(sts) > 0 {
		var again []*staged
		for _, st := range sts {
			if releases[st.VolumeID] == nil {
				done, err := n.claim(st.VolumeID)
				if err != nil {
					again = append(again, st) // the CO is at it: look again later
					continue
				}
				releases[st.VolumeID] = done
			}
			n.mu.Lock()
			_, still := n.volumes[st.VolumeID]
			n.mu.Unlock()
			var err error
			if still {
				err = n.stage(ctx, st)
			}
			releases[st.VolumeID]()
			delete(releases, st.VolumeID)
			_, refused := refusals[status.Code(err).String()]
			switch {
			case !still:
			case err != nil && (refused || status.Code(err) == codes.AlreadyExists):
				// The gateway refuses it (its job ended meanwhile, say):
				// it stays staged without an agent until the CO unstages
				// it, which undoes what its state recorded.
				n.log().Error("could not take back a staged volume: refused", "volume", st.VolumeID, "err", err)
			case err != nil:
				n.log().Error("could not take back a staged volume; trying again", "volume", st.VolumeID, "err", err, "in", RetryEvery)
				again = append(again, st)
			default:
				n.log().Info("took back a staged volume", "volume", st.VolumeID, "targets", len(st.Targets))
			}
		}
		sts = again
		if len(sts) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(RetryEvery):
		}
	}
}
