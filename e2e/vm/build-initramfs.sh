#!/usr/bin/env bash
# Builds the initramfs (a newc cpio archive) of the real-kernel e2e VM:
# busybox (static), nvme-cli, cryptsetup and dmsetup with the shared
# libraries ldd lists, the project's binaries built static (and the CSI
# story's csi-kubelet and csi-sanity), the shipped policy, /init, /lib.sh
# and /story.sh.
#
#   e2e/vm/build-initramfs.sh OUT.cpio
#   VM_MODULES=DIR VM_USERLAND=DIR VM_STORY=FILE e2e/vm/build-initramfs.sh OUT.cpio
#
# The Linux 6.12 tier gives VM_MODULES (fetch-kernel-6.12.sh's modules/,
# loaded by /init in load.order), VM_USERLAND (fetch-userland-trixie.sh's
# tree: tlshd, nvme-cli 2.13 and keyctl with their libraries, used instead
# of the machine's nvme-cli) and VM_STORY (its story, e.g. story-6.12.sh).
#
# Needs: busybox-static nvme-cli cryptsetup-bin dmsetup cpio. Takes seconds once Go's build cache
# is warm; it is rebuilt on every run because it holds the code under test.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1"

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,tmp,run,etc,usr/sbin}

# busybox-static installs a static /bin/busybox (the VM has no libc for a
# dynamic one).
busybox=/bin/busybox
[ -x "$busybox" ] || { echo "build-initramfs: $busybox missing: apt-get install busybox-static" >&2; exit 1; }
cp "$busybox" "$root/bin/busybox"

if [ -n "${VM_USERLAND:-}" ]; then
  cp -a "$VM_USERLAND"/. "$root/"
else
  # The machine's nvme-cli, cryptsetup and dmsetup, the loader and every
  # library, at the paths the binaries ask for.
  for tool in nvme cryptsetup dmsetup; do
    bin="$(command -v "$tool" || true)"
    [ -n "$bin" ] || { echo "build-initramfs: $tool missing: scripts/deps.sh installs it" >&2; exit 1; }
    cp "$bin" "$root/usr/sbin/$tool"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
fi
if [ -n "${VM_MODULES:-}" ]; then
  mkdir -p "$root/lib/modules"
  cp "$VM_MODULES"/* "$root/lib/modules/"
fi

(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$root/bin/" \
  ./cmd/nvmegated ./cmd/nvmegate ./cmd/nvmegate-target ./cmd/nvmegate-node ./cmd/nvmegate-csi ./e2e/vm/csi-kubelet)

# The CSI project's csi-sanity (make test builds it static), for the
# story's run of the whole suite against nvmegate-csi on the real kernel.
if [ -n "${NVMEGATE_CSI_SANITY:-}" ]; then
  cp "$NVMEGATE_CSI_SANITY" "$root/bin/csi-sanity"
fi

# The shipped policy (its sources, not its tests): the story hot-reloads a
# tightened copy of it.
mkdir -p "$root/policy"
cp "$repo"/policy/*.rego "$repo"/policy/*.json "$root/policy/"
rm -f "$root"/policy/*_test.rego

install -m 0755 "$here/init" "$root/init"
install -m 0755 "${VM_STORY:-$here/story.sh}" "$root/story.sh"
install -m 0644 "$here/lib.sh" "$root/lib.sh"
(cd "$root" && find . | cpio -o -H newc --quiet) > "$out.tmp"
mv "$out.tmp" "$out"
