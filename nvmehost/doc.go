// Package nvmehost drives the Linux NVMe over Fabrics host through the
// kernel's own interfaces, the ones nvme-cli uses: a controller is created
// by writing an option string to /dev/nvme-fabrics and reading back its
// instance (drivers/nvme/host/fabrics.c), and a live controller is read,
// re-keyed and deleted through its attributes in /sys/class/nvme/nvmeN
// (drivers/nvme/host/sysfs.c). Writing a new DH-HMAC-CHAP secret to
// dhchap_secret makes the kernel re-authenticate the controller in place,
// without a disconnect (seen on Linux 6.1 and 6.12).
//
// The option strings and the dhchap attributes hold secrets: nothing in
// this package puts them in an error or a log line.
package nvmehost
