// Package targetagent programs storage targets: it builds a target's
// desired state (fabric.State) from the store — every subsystem on the
// target, with the hosts its active, unexpired grants allow and the
// credentials derived for them — and applies it with the target's driver.
//
// The embedded agent runs inside the gateway (one machine, the demo): the
// gateway calls Program after every change of a target's grants and before
// it answers a Connect, so a grant is only handed out once the target
// accepts its host. Program is idempotent; Reconcile programs every target,
// as after a restart.
package targetagent
