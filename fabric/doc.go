// Package fabric is the target side of nvmegate: the desired state of a
// storage target (its subsystems, their ports, and the hosts allowed on
// each with their DH-HMAC-CHAP secrets), built from the store's grants,
// and the Driver interface the target drivers implement.
//
// A driver reconciles a target to a desired state: Apply is idempotent,
// removes what the state no longer names and leaves what already matches
// untouched, so that applying after a restart converges every target to
// the grants in the store. Drivers: fabric/nvmet (Linux nvmet configfs).
package fabric
