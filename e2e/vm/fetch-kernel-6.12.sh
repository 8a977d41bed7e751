#!/usr/bin/env bash
# Fetches the kernel of the Linux 6.12 VM tier once per machine: Debian's own
# prebuilt cloud kernel (linux-image-6.12.*-cloud-amd64-unsigned from
# bookworm-security, the newest the machine's apt lists offer), the very
# binary Debian users run. Its config already has NVMe/TCP TLS on host and
# target (NVME_TCP_TLS, NVME_TARGET_TCP_TLS), the in-kernel handshake upcall
# (NET_HANDSHAKE) and both DH-HMAC-CHAP options; what it builds as modules
# (nvme-tcp, nvmet, nvmet-tcp, tls, configfs, null_blk, dm-crypt) are
# unpacked, decompressed (busybox's insmod reads plain ELF) and listed in
# load order in modules/load.order.
#
#   e2e/vm/fetch-kernel-6.12.sh     # prints .../linux-image-<version>/ (vmlinuz, modules/)
#
# Seconds the first time (a 34 MB download), instant after. Needs apt-get,
# dpkg-deb, xz; never installs the package.
set -euo pipefail

CACHE="${VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/vm}"
pick() { apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb[0-9]+-cloud-amd64-unsigned$' | cut -d' ' -f1 | sort -V | tail -1; }
pkg="$(pick)"
if [ -z "$pkg" ]; then
  # The lists may predate 6.12 in bookworm-security: refresh them once.
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -q >&2
  pkg="$(pick)"
fi
[ -n "$pkg" ] || { echo "fetch-kernel-6.12: no linux-image-6.12 cloud kernel in the apt lists (bookworm-security)" >&2; exit 1; }
version="$(apt-cache policy "$pkg" | sed -n 's/^  Candidate: //p')"
# The modules the story needs (their dependencies come along): TLS is done
# by kTLS with AES-GCM, whose crypto templates are modules too (without
# them tlshd's handshake ends in "The kernel does not support the
# requested algorithm"), and the VM has no modprobe to load them on demand.
MODULES="configfs tls ghash-generic gcm nvme-fabrics nvme-tcp nvmet nvmet-tcp null-blk dm-crypt xts loop algif-skcipher"
out="$CACHE/$pkg-$version-$(echo "$MODULES" | sha256sum | cut -c1-8)"
if [ -s "$out/vmlinuz" ] && [ -s "$out/modules/load.order" ]; then
  echo "$out"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetching $pkg $version for the 6.12 VM tier into $out" >&2
(cd "$work" && apt-get download -q "$pkg=$version" >&2 2>/dev/null) ||
  (cd "$work" && apt-get download "$pkg=$version" >&2)
dpkg-deb -x "$work"/*.deb "$work/x"
kver="${pkg#linux-image-}"; kver="${kver%-unsigned}"
mods="$work/x/lib/modules/$kver/kernel"
[ -d "$mods" ] || { echo "fetch-kernel-6.12: no modules for $kver in $pkg" >&2; exit 1; }

mkdir -p "$work/out/modules"
cp "$work/x/boot/vmlinuz-$kver" "$work/out/vmlinuz"
cp "$work/x/boot/config-$kver" "$work/out/config"
# The modules the story needs, each after what it depends on (read from the
# module's own depends= field: the package ships no modules.dep).
declare -A path=() done=()
while IFS= read -r f; do
  n="$(basename "$f" .ko.xz)"; path[${n//_/-}]="$f"
done < <(find "$mods" -name '*.ko.xz')
order=()
add() {
  local n="${1//_/-}" d
  [ -n "${done[$n]:-}" ] && return 0
  [ -n "${path[$n]:-}" ] || { echo "fetch-kernel-6.12: module $n not in $pkg" >&2; exit 1; }
  for d in $(xz -dc "${path[$n]}" | tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' '); do add "$d"; done
  done[$n]=1
  xz -dc "${path[$n]}" > "$work/out/modules/$n.ko"
  order+=("$n")
}
for m in $MODULES; do add "$m"; done
printf '%s\n' "${order[@]}" > "$work/out/modules/load.order"

mkdir -p "$(dirname "$out")"
rm -rf "$out.tmp" && mv "$work/out" "$out.tmp" && rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out"
