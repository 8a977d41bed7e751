#!/usr/bin/env bash
# Builds the Linux kernel for the real-kernel e2e tier once per machine, from
# Debian's linux-source-6.1 package and kernel.config (merged over tinyconfig),
# into a cache directory keyed by the source version and the fragment's hash,
# and prints the bzImage's path.
#
#   e2e/vm/build-kernel.sh        # prints .../kernel-6.1.192-3-<hash>/bzImage
#
# About 9 minutes on 2 cores the first time; instant after.
# Needs: linux-source-6.1 bc flex bison libelf-dev libssl-dev.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

src_tar=/usr/src/linux-source-6.1.tar.xz
if [ ! -f "$src_tar" ]; then
  echo "build-kernel: $src_tar missing: apt-get install linux-source-6.1" >&2
  exit 1
fi
version="$(dpkg-query -W -f '${Version}' linux-source-6.1)"
frag_hash="$(sha256sum "$here/kernel.config" | cut -c1-12)"
CACHE="${VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/vm}"
out="$CACHE/kernel-$version-$frag_hash/bzImage"
if [ -s "$out" ]; then
  echo "$out"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building Linux $version for the VM tier into $out (about 9 minutes on 2 cores)" >&2
tar -C "$work" -xf "$src_tar"
cd "$work"/linux-source-6.1
{
  make -s tinyconfig
  scripts/kconfig/merge_config.sh -m .config "$here/kernel.config"
  make -s olddefconfig
} >&2
# merge_config warns but does not fail when a symbol is dropped: check that
# every requested option made it, so a missing one is a build error here
# rather than a puzzling failure inside the VM.
missing=0
while IFS= read -r line; do
  case "$line" in CONFIG_*=y) ;; *) continue ;; esac
  grep -qx "$line" .config || { echo "build-kernel: $line did not survive olddefconfig" >&2; missing=1; }
done < "$here/kernel.config"
[ "$missing" -eq 0 ] || exit 1
make -s -j"$(nproc)" bzImage >&2
mkdir -p "$(dirname "$out")"
cp arch/x86/boot/bzImage "$out.tmp"
cp .config "$(dirname "$out")/config"
mv "$out.tmp" "$out"
echo "$out"
