// Package fabric is the target side of nvmegate: the desired state of a
// storage target (its subsystems, their ports, and the hosts allowed on
// each with their DH-HMAC-CHAP secrets and TLS PSKs), built from the
// store's grants, and its changes.
//
// A State is a whole target; a Delta changes host entries of a state (a
// host added, re-keyed or removed on one subsystem), from one generation
// to the next. The drivers — fabric/nvmet (Linux nvmet configfs) and
// fabric/spdk (an SPDK nvmf_tgt over JSON-RPC) — take both, through the
// interface their user declares (targetagent.Driver): Apply reconciles a
// target to a whole state — idempotent, it removes what the state no
// longer names and leaves what already matches untouched, so that applying
// after a restart converges every target to the grants in the store —
// and ApplyDelta touches only the hosts a delta names, on top of the
// state the driver applied last, or refuses with ErrNeedFull.
package fabric
