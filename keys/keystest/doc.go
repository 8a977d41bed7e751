// Package keystest is the conformance suite every keys.Backend passes:
// versions, check-and-set conflicts, concurrent rotation, grace expiry,
// data-key wrap/unwrap/rotate, and persistence across a reopen. Each
// backend's own tests call Run with a constructor for a real instance.
package keystest
