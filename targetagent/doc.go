// Package targetagent programs storage targets: it keeps each target's
// desired state — every subsystem on the target with its ports and
// namespaces, and per host on each subsystem the entry its newest active,
// unexpired grant decides, with the credentials derived for it — and
// brings the target to it with the target's driver (Driver: fabric/nvmet,
// fabric/spdk), or through the target's own agent (Remote, in
// cmd/nvmegate-target) connected to the gateway's Hub.
//
// The embedded agent runs inside the gateway (one machine, the demo): the
// gateway calls Program after every change of a target's grants and before
// it answers a Connect, so a grant is only handed out once the target
// accepts its host. Program is idempotent; Reconcile programs every target
// whole, as after a restart.
//
// # Whole states and deltas
//
// A grant change names the host entries it changed (Program's HostRefs):
// the agent recomputes only those — from the active grants of the nodes
// holding them, with the host's entries on the target's other subsystems
// (one hosts/ entry on nvmet) — and sends the difference as a
// fabric.Delta, so a change costs the same on a target of ten hosts as on
// one of ten thousand. The state is rebuilt whole from the store, and sent
// whole, by Program without HostRefs (Reconcile every 30 s, which also
// drops hosts whose grants expired or whose root passed its grace; an agent
// connecting), after InventoryChanged, for a change on a subsystem the
// state does not have, and after any failure. A delta goes only to a sink
// that acknowledged the generation it is based on; otherwise, or when the
// sink refuses it with fabric.ErrNeedFull, the sink gets the whole state.
//
// On the stream (TargetAgent.Watch) every update has a generation: a whole
// state first, on every (re)connection, then deltas, each based on the one
// before, to agents that ask for them (agents from before deltas get whole
// states). The remote agent applies them in order and acknowledges each
// generation; a delta on top of another generation than the one it
// applied last is refused (acknowledged as an error) and the agent
// reconnects, which starts the stream again with the whole state. Deltas
// applied in order leave the target exactly as the whole state would
// (delta_test.go checks it against the store, on nvmet trees, locally and
// over gRPC).
//
// # Replicas: states that never go back
//
// Behind several gateway replicas (one store shared in etcd) an agent
// streams from one replica at a time (Remote.Replicas: one connection
// each) and moves to the next when a stream ends, is refused, or falls
// silent (issue 29, defects 2 and 7). Every update carries the store
// revision it reflects (Update.Revision, read after the state was built),
// and the agent refuses a state — or a heartbeat — older than one it has
// applied: a replica that lags cannot bring back a host the others
// removed. The gateway sends agents that ask a heartbeat at once and every
// HeartbeatInterval, each only after its replica passes the read barrier;
// an agent leaves a stream silent for Remote.Silence (DefaultSilence). A
// replica waiting for another replica's agent to acknowledge stops waiting
// when the agent attaches to it, and sends it the state at once.
//
// # Namespaces a target cannot serve
//
// One namespace must not hold back a whole target (issue 29, defect 5). A
// driver that applied a state except some namespaces — no dm-crypt for a
// backing device, cryptsetup refusing one — returns a
// *fabric.NotServedError: those namespaces are not exported (never in the
// clear) and everything else is applied, hosts removed first. The remote
// agent acknowledges such a generation as applied with the list
// (AckRequest.not_served) and keeps its stream; the agent here answers the
// generation's callers and keeps the list per target (NotServed, logged on
// change, counted by nvmegate_target_namespaces_not_served). A namespace
// whose data key cannot be had is, in the state the agent builds, held
// (fabric.Namespace.Held: the key store is away) or left out (the key
// store says there is none for it). Only a namespace the target could not
// take down (NotServed.Exported) still fails the generation: a removal not
// done.
//
// # One programmer per target
//
// A target is programmed one way, chosen by configuration: by a local
// driver of this gateway, or by its own agent (the daemon's remote
// targets). A target with a local driver takes no agent stream
// (ErrLocalTarget), so a stolen or misconfigured target SVID cannot take
// it over. A remote target has at most one live stream:
//
//   - a second Watch of the target is refused (ErrAgentConnected,
//     FailedPrecondition) while the first is live; the second agent
//     retries with backoff and gets in once the first stream ends;
//   - an acknowledgement counts only if it names the live stream
//     (WatchResponse.stream_id, random per stream); any other is refused
//     (ErrNotLiveStream) and settles nothing;
//   - a stream that stops taking state is ended, not left connected and
//     deaf: one that did not acknowledge within Hub.AckTimeout, or
//     acknowledged a failed application, is closed with Unavailable, and
//     its agent reconnects and starts again from the whole state.
//
// While no stream is live a remote target is not programmed (Program
// fails, nothing is granted), and a grant that ended meanwhile stays
// pending removal until the target's agent acknowledges a state without
// it (see lease: the caller is told, and the gateway retries).
package targetagent
