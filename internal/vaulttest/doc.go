// Package vaulttest runs a real HashiCorp Vault dev server for tests: the
// binary that scripts/build-vault.sh builds and caches, started on a free
// loopback port with a random root token and Transit mounted at transit/ and nvmegate-kek/,
// and stopped when the test ends.
//
// Without the binary a test is skipped, except under CI=true, where it
// fails: CI must run the Vault suite, not pass it by skipping.
package vaulttest
