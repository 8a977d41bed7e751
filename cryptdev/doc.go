// Package cryptdev opens a block device through dm-crypt with a
// namespace's data key, for the target agent to export the mapped device
// instead of the device itself: what lands on the device is AES-XTS
// ciphertext, and without the data key nothing on it can be read.
//
// It drives cryptsetup (Debian's cryptsetup-bin) in plain mode: no header
// on the device, the dm-crypt key derived from the data key alone, so
// destroying the data key (crypto-erase) leaves nothing that decrypts it.
// The key reaches cryptsetup on its standard input, never on a command
// line or in a file. Why cryptsetup and not the device-mapper ioctls
// directly: docs/decisions.md.
package cryptdev
