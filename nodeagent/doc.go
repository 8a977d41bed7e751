// Package nodeagent is the node side of nvmegate: for one training job it
// discovers the subsystems the gateway lets this node reach, takes a grant
// for each, installs the TLS PSK in the node's keyring, connects through
// the kernel, renews before expiry, re-keys the live controllers after a
// rotation (the kernel re-authenticates them in place: no disconnect), and
// at the job's end or on shutdown deletes the controllers, removes the
// keys and releases the grants.
//
// The agent holds secrets only in memory, for the reconnect a lost
// controller needs; its status (Status) names grants, controllers,
// expiries and key versions, never a secret.
package nodeagent
