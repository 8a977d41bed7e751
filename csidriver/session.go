package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nvmegate/nvmegate"
	"github.com/nvmegate/nvmegate/nodeagent"
	"github.com/nvmegate/nvmegate/nvmehost"
	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// session is one node agent: one job's grant for one subsystem, shared by
// the volumes of its namespaces. A node connects a subsystem for one job
// at a time: the kernel has one controller per host and subsystem, and
// two agents would each take it over and the first to leave delete it.
type session struct {
	agent   *nodeagent.Agent
	cancel  context.CancelFunc
	done    chan struct{}
	err     error           // Run's, once done is closed
	users   map[string]bool // volume IDs; guarded by Node.mu
	leaving bool            // the last volume left (leave); guarded by Node.mu
}

// stage connects st's namespace, waits for its device and records st as
// staged. On failure the agent it started is stopped again.
func (n *Node) stage(ctx context.Context, st *staged) error {
	v := st.vol
	s, err := n.join(v, st.VolumeID)
	if err != nil {
		return err
	}
	n.mu.Lock()
	st.s = s
	n.mu.Unlock()
	dev, err := n.await(ctx, s, v)
	if err == nil && st.Mode == nvmegate.ModeReadOnly {
		if rerr := n.Mounter.ReadOnly(dev); rerr != nil {
			err = status.Errorf(codes.Internal, "make %s read-only: %v", dev, rerr)
		}
	}
	if err == nil {
		n.mu.Lock()
		st.Device = dev
		n.mu.Unlock()
		n.record(st)
		err = n.save(st)
	}
	if err != nil {
		if lerr := n.leave(context.WithoutCancel(ctx), st); lerr != nil {
			n.log().Error("stage failed; and undoing it", "volume", st.VolumeID, "err", lerr)
		}
		return err
	}
	n.mu.Lock()
	if n.volumes == nil {
		n.volumes = map[string]*staged{}
	}
	n.volumes[st.VolumeID] = st
	n.mu.Unlock()
	n.log().Info("staged", "volume", st.VolumeID, "job", v.Job, "device", dev, "mode", st.Mode)
	return nil
}

// record keeps in st what its agent connected and holds now.
func (n *Node) record(st *staged) {
	n.mu.Lock()
	s := st.s
	n.mu.Unlock()
	if s == nil {
		return
	}
	as := s.agent.Status()
	n.mu.Lock()
	defer n.mu.Unlock()
	st.HostNQN = as.HostNQN
	for _, ss := range as.Subsystems {
		if ss.Subsystem == st.vol.NQN {
			if ss.Controller != "" {
				st.Controller = ss.Controller
			}
			if ss.Grant != "" && !slices.Contains(st.Grants, ss.Grant) {
				st.Grants = append(st.Grants, ss.Grant)
			}
		}
	}
}

// join adds a volume to the live session of its subsystem, starting one
// if there is none. Another job's session on the subsystem refuses it.
func (n *Node) join(v Volume, id string) (*session, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sessions == nil {
		n.sessions = map[string]*session{}
	}
	if s, ok := n.sessions[v.NQN]; ok {
		if s.agent.Job != v.Job {
			return nil, status.Errorf(codes.FailedPrecondition, "subsystem %s is connected on this node for job %s; a node serves one job per subsystem at a time", v.NQN, s.agent.Job)
		}
		s.users[id] = true
		return s, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{cancel: cancel, done: make(chan struct{}), users: map[string]bool{id: true},
		agent: &nodeagent.Agent{Gateway: n.Gateway, Kernel: n.Kernel, Keys: n.Keys, Job: v.Job,
			Subsystems: []string{v.NQN}, TTL: n.TTL, RenewEvery: n.RenewEvery,
			Log: n.log().With("job", v.Job, "subsystem", v.NQN)}}
	n.sessions[v.NQN] = s
	go func() {
		err := s.agent.Run(ctx)
		n.mu.Lock()
		s.err = err
		leaving := s.leaving
		if n.sessions[v.NQN] == s {
			delete(n.sessions, v.NQN)
		}
		n.mu.Unlock()
		close(s.done)
		if !leaving {
			n.ended(s)
		}
	}()
	return s, nil
}

// ended takes the devices of a session whose agent stopped by itself (its
// job's grants ended: finished, revoked, expired) away from the pods: the
// kernel deleted the controller, and a device number it freed may name
// another namespace next. The volumes stay staged, without an agent,
// until the CO stages them again or unstages them.
func (n *Node) ended(s *session) {
	n.mu.Lock()
	var sts []*staged
	for _, st := range n.volumes {
		if st.s == s {
			st.s = nil
			sts = append(sts, st)
		}
	}
	n.mu.Unlock()
	for _, st := range sts {
		n.mu.Lock()
		targets := st.Targets
		st.Targets = nil
		n.mu.Unlock()
		for t := range targets {
			if err := n.Mounter.Unpublish(t); err != nil {
				n.log().Error("the job's grants ended; its device could not be taken from a pod", "volume", st.VolumeID, "target", t, "err", err)
			}
		}
		n.mu.Lock()
		_, still := n.volumes[st.VolumeID]
		n.mu.Unlock()
		if still { // not unstaged meanwhile: its state file stays removed
			n.save(st)
		}
		n.log().Warn("the job's grants ended: its device is taken from its pods", "volume", st.VolumeID, "job", st.vol.Job, "pods", len(targets), "err", s.err)
	}
}

// leave takes st out of its session; the last one out stops the agent,
// which disconnects and releases the grant. With no agent (it stopped,
// or the plugin restarted), what st recorded is undone instead. An error
// says what did not happen; st then has no agent, and the same call
// again undoes the rest.
func (n *Node) leave(ctx context.Context, st *staged) error {
	n.mu.Lock()
	s := st.s
	st.s = nil
	stop := false
	if s != nil {
		delete(s.users, st.VolumeID)
		if len(s.users) == 0 {
			s.leaving, stop = true, true
			if n.sessions[st.vol.NQN] == s {
				delete(n.sessions, st.vol.NQN)
			}
		}
	}
	n.mu.Unlock()
	if s == nil {
		return n.undo(ctx, st)
	}
	if !stop {
		return nil
	}
	s.cancel()
	<-s.done
	if s.err == nil || errors.Is(s.err, nodeagent.ErrJobEnded) || errors.Is(s.err, nodeagent.ErrNotGranted) {
		return nil
	}
	return s.err
}

// undo deletes the controller st recorded, if it is still this host's to
// st's subsystem and no live session has it, and releases the grants st
// recorded (one the gateway ended already counts as released).
func (n *Node) undo(ctx context.Context, st *staged) error {
	n.mu.Lock()
	_, live := n.sessions[st.vol.NQN]
	ctrl, host, grants := st.Controller, st.HostNQN, st.Grants
	n.mu.Unlock()
	if ctrl != "" && !live {
		in, err := n.Kernel.Info(ctrl)
		if err == nil && in.SubNQN == st.vol.NQN && in.HostNQN == host {
			err = n.Kernel.Delete(ctrl)
		}
		if err != nil && !errors.Is(err, nvmehost.ErrNoController) {
			return fmt.Errorf("disconnect %s: %w", ctrl, err)
		}
	}
	for _, g := range grants {
		_, err := n.Gateway.Release(ctx, &pb.ReleaseRequest{GrantId: g})
		switch status.Code(err) {
		case codes.OK, codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied:
		default:
			return fmt.Errorf("release %s: %w", g, err)
		}
	}
	return nil
}

// device is st's block device now, from its live agent's controller.
func (n *Node) device(st *staged) (string, error) {
	n.mu.Lock()
	s := st.s
	n.mu.Unlock()
	if s == nil {
		return "", status.Errorf(codes.FailedPrecondition, "volume %s has no live grant on this node (its job's grants ended): stage it again", st.vol.Handle())
	}
	for _, ss := range s.agent.Status().Subsystems {
		if ss.Subsystem != st.vol.NQN || ss.Controller == "" || ss.State != "live" {
			continue
		}
		dev, err := n.Kernel.Device(ss.Controller, st.vol.NSID)
		if err != nil || dev == "" {
			break
		}
		n.mu.Lock()
		moved := dev != st.Device
		st.Device = dev
		n.mu.Unlock()
		if moved && st.Mode == nvmegate.ModeReadOnly {
			if err := n.Mounter.ReadOnly(dev); err != nil {
				return "", status.Errorf(codes.Internal, "make %s read-only: %v", dev, err)
			}
		}
		return dev, nil
	}
	return "", status.Errorf(codes.Unavailable, "volume %s: no block device now (its controller is reconnecting)", st.vol.Handle())
}

// refusals are the gateway's answers that waiting does not change.
var refusals = map[string]codes.Code{
	codes.PermissionDenied.String():   codes.PermissionDenied,
	codes.NotFound.String():           codes.FailedPrecondition,
	codes.FailedPrecondition.String(): codes.FailedPrecondition,
	codes.InvalidArgument.String():    codes.InvalidArgument,
}

// await waits until the volume's namespace has its block device.
func (n *Node) await(ctx context.Context, s *session, v Volume) (string, error) {
	limit := n.ConnectTimeout
	if limit <= 0 {
		limit = time.Minute
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "the agent has not connected yet"
	for {
		select {
		case <-s.done:
			return "", endedErr(v, s.err)
		case <-ctx.Done():
			return "", status.Errorf(codes.DeadlineExceeded, "volume %s: %v while connecting (%s)", v.Handle(), ctx.Err(), last)
		case <-deadline.C:
			return "", status.Errorf(codes.DeadlineExceeded, "volume %s: no block device after %v (%s)", v.Handle(), limit, last)
		case <-tick.C:
		}
		for _, ss := range s.agent.Status().Subsystems {
			if ss.Subsystem != v.NQN {
				continue
			}
			if ss.Error != "" {
				if code, ok := refusals[ss.ErrorCode]; ok {
					return "", status.Errorf(code, "volume %s: nvmegate refused this node: %s", v.Handle(), ss.Error)
				}
				last = ss.Error
			}
			if ss.Controller == "" || ss.State != "live" {
				continue
			}
			dev, err := n.Kernel.Device(ss.Controller, v.NSID)
			if err != nil || dev == "" {
				last = fmt.Sprintf("controller %s is live; namespace %d has no block device yet", ss.Controller, v.NSID)
				continue
			}
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
			last = dev + " is not there yet"
		}
	}
}

// endedErr says why an agent stopped before the volume was staged.
func endedErr(v Volume, err error) error {
	switch {
	case errors.Is(err, nodeagent.ErrNotGranted):
		return status.Errorf(codes.FailedPrecondition, "volume %s is not published to this node: %v", v.Handle(), err)
	case errors.Is(err, nodeagent.ErrJobEnded):
		return status.Errorf(codes.FailedPrecondition, "volume %s: job %s's grants ended", v.Handle(), v.Job)
	case err == nil:
		return status.Errorf(codes.Aborted, "volume %s: the node agent stopped", v.Handle())
	}
	return fromGateway("volume "+v.Handle(), err)
}
