#!/usr/bin/env bash
# Installs the Debian packages the tests use, when any is missing (as root,
# or through sudo): nvme-cli to check the NVMe formats we emit, and for the
# real-kernel tier (e2e/vm) Debian's kernel source and what builds it, qemu,
# busybox and cpio, cryptsetup and dmsetup (the 6.1 VM's encryption at
# rest), (and for the 6.12 tier binutils' readelf and xz, which
# unpack Debian's kernel modules and Debian 13's tlshd and nvme-cli), and
# chromium, in which the auditor's report is rendered
# and checked (report package), and Slurm 22.05 (slurmctld, slurmd, the
# client and munge: the hostlist package is checked against scontrol, and
# the Slurm tier runs a one-node cluster). Instant when all are there.
set -euo pipefail

pkgs=(make git nvme-cli linux-source-6.1 bc flex bison libelf-dev libssl-dev
  qemu-system-x86 busybox-static cpio chromium binutils xz-utils cryptsetup-bin dmsetup
  slurmctld slurmd slurm-client munge)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "deps: missing Debian packages: ${missing[*]} (install them as root)" >&2
    exit 1
  }
  SUDO=sudo
fi
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
