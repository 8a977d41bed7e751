// Package e2e holds the end-to-end tier: tests that build the real binaries
// and run them as processes, the way users and CI do. `make test` runs it
// with the other tiers; `go test -short` skips it.
//
// The real-kernel test boots a minimal Linux VM under qemu (vm/: the kernel
// config fragment and build script, the initramfs builder, /init and the
// story the VM runs) with the nvmet target and the nvme-tcp host, so the
// DH-HMAC-CHAP secrets nvmegate issues are checked by Linux itself. It
// needs NVMEGATE_VM_KERNEL (make test builds the kernel and sets it).
package e2e
