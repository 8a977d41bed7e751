// Package localstore is the embedded keys.Backend of single-machine
// installs and the demo: one bbolt file whose values are each sealed with
// AES-256-GCM under a 32-byte key file (mode 0600, created if absent), with
// the bucket and key as associated data so that a sealed value cannot be
// moved to another name. Data keys are wrapped by per-namespace KEKs kept
// (sealed) in the same file.
//
// The key file is the root of trust: whoever reads it reads every key. Keep
// it on a different volume from the database where you can.
package localstore
