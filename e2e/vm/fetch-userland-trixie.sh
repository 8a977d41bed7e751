#!/usr/bin/env bash
# Fetches the user space of the Linux 6.12 VM tier once per machine: tlshd
# (ktls-utils 1.0.0, which does the NVMe/TCP TLS handshakes for the kernel),
# nvme-cli 2.13 with libnvme 1.13 (TLS options), keyctl, and cryptsetup and
# dmsetup (encryption at rest under nvmet namespaces), from Debian 13
# (trixie) — bookworm has no ktls-utils. The packages are downloaded with a
# private apt configuration (the machine's own Debian mirror, the suite
# name changed; signatures checked with the machine's archive keyring) and
# unpacked, never installed; the binaries, their loader and the libraries
# they need (readelf NEEDED, resolved inside the unpacked packages) are
# staged at their paths for the VM's initramfs.
#
#   e2e/vm/fetch-userland-trixie.sh    # prints .../trixie-userland-<hash>/ (a root tree)
#
# About 30 seconds the first time (36 packages, ~14 MB), instant after.
# Needs apt-get, dpkg-deb, readelf (binutils).
set -euo pipefail

CACHE="${VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/vm}"
SUITE=trixie
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
BINARIES="/usr/sbin/tlshd /usr/sbin/nvme /usr/bin/keyctl /usr/sbin/cryptsetup /usr/sbin/dmsetup"
# The packages owning those binaries and every library they load.
PKGS="ktls-utils nvme-cli keyutils libnvme1t64 libkeyutils1 libc6 libatomic1 libffi8
  libglib2.0-0t64 libgmp10 libgnutls30t64 libhogweed6t64 libidn2-0 libjson-c5 libnettle8t64
  libnl-3-200 libnl-genl-3-200 libp11-kit0 libpcre2-8-0 libssl3t64 libtasn1-6 libunistring5
  libzstd1 zlib1g cryptsetup-bin dmsetup libcryptsetup12 libdevmapper1.02.1 libargon2-1 libblkid1 libuuid1
  libpopt0 libselinux1 libudev1 libcap2"

mirror="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
[ -n "$mirror" ] || mirror="$(awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
[ -n "$mirror" ] || { echo "fetch-userland-trixie: no Debian mirror in this machine's apt sources" >&2; exit 1; }

apt_dir="$CACHE/apt-$SUITE"
mkdir -p "$apt_dir"/lists/partial "$apt_dir"/cache/archives/partial
echo "deb [signed-by=$KEYRING] $mirror $SUITE main" > "$apt_dir/sources.list"
: > "$apt_dir/status"
opts=(-o Dir::Etc::sourcelist="$apt_dir/sources.list" -o Dir::Etc::sourceparts=-
  -o Dir::State::lists="$apt_dir/lists" -o Dir::State::status="$apt_dir/status"
  -o Dir::Cache="$apt_dir/cache" -o APT::Architecture=amd64 -o Acquire::Languages=none
  -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
  -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false)

# The cache is keyed by the packages' versions: a point release makes a new tree.
versions() { for p in $PKGS; do apt-cache "${opts[@]}" policy "$p" | sed -n "s/^  Candidate: /$p=/p"; done; }
v="$(versions 2>/dev/null | grep -v '=(none)' || true)"
if [ "$(printf '%s\n' "$v" | grep -c =)" -ne "$(echo $PKGS | wc -w)" ]; then
  apt-get -q "${opts[@]}" update >&2
  v="$(versions)"
fi
out="$CACHE/trixie-userland-$(printf '%s\n' "$v" | sha256sum | cut -c1-12)"
if [ -x "$out/usr/sbin/tlshd" ]; then
  echo "$out"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetching tlshd, nvme-cli and keyctl from Debian $SUITE into $out" >&2
mkdir -p "$work/debs" "$work/root" "$work/out"
# shellcheck disable=SC2046
(cd "$work/debs" && apt-get -q "${opts[@]}" download $(printf '%s\n' "$v") >&2)
for f in "$work"/debs/*.deb; do dpkg-deb -x "$f" "$work/root"; done
root="$work/root"

# Resolve NEEDED recursively inside the unpacked tree.
find_lib() {
  local d
  for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib /lib; do
    [ -e "$root$d/$1" ] && { echo "$d/$1"; return 0; }
  done
  return 1
}
declare -A seen=()
queue=($BINARIES)
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}; queue=("${queue[@]:1}")
  [ -n "${seen[$f]:-}" ] && continue
  seen[$f]=1
  [ -e "$root$f" ] || { echo "fetch-userland-trixie: $f is not in the packages" >&2; exit 1; }
  for so in $(readelf -d "$root$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    p="$(find_lib "$so")" || { echo "fetch-userland-trixie: $so (needed by $f) is in none of the packages" >&2; exit 1; }
    queue+=("$p")
  done
done
for f in "${!seen[@]}"; do
  mkdir -p "$work/out$(dirname "$f")"
  cp -L "$root$f" "$work/out$f"
done
# The loader at its multiarch path and where the binaries ask for it.
cp -L "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$work/out/usr/lib/x86_64-linux-gnu/"
mkdir -p "$work/out/lib64"
ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$work/out/lib64/ld-linux-x86-64.so.2"
# tlshd exits without its config; the VM's story writes its own.
mkdir -p "$work/out/etc"
cp "$root/etc/tlshd.conf" "$work/out/etc/tlshd.conf"
printf '%s\n' "$v" > "$work/out/etc/trixie-packages"

rm -rf "$out.tmp" && mv "$work/out" "$out.tmp" && rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out"
