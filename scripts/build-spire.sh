#!/usr/bin/env bash
# Builds the SPIRE server and agent once per machine from the Go module
# proxy, into a cache directory keyed by version, and prints the directory
# (holding spire-server and spire-agent). SPIRE's dependencies stay in a
# throwaway module, out of our go.mod.
#
#   scripts/build-spire.sh        # prints .../spire-v1.13.3
#   NVMEGATE_SPIRE=$(scripts/build-spire.sh) go test ./e2e
#
# About 9 CPU-minutes (7 minutes on 2 cores) on a fresh machine; instant after.
set -euo pipefail

VERSION="${SPIRE_VERSION:-v1.13.3}"
CACHE="${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/tools}"
OUT="$CACHE/spire-$VERSION"

if [ -x "$OUT/spire-server" ] && [ -x "$OUT/spire-agent" ]; then
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > go.mod <<MOD
module spirebuild

go 1.25
MOD
echo "building SPIRE ${VERSION} into $OUT (about 18 CPU-minutes the first time)" >&2
mkdir -p "$OUT"
export GOFLAGS=-mod=mod GOWORK=off
go get -tool "github.com/spiffe/spire/cmd/spire-server@${VERSION}" "github.com/spiffe/spire/cmd/spire-agent@${VERSION}" >&2
for cmd in spire-server spire-agent; do
  go build -trimpath -o "$OUT/$cmd.tmp" "github.com/spiffe/spire/cmd/$cmd" >&2
  mv "$OUT/$cmd.tmp" "$OUT/$cmd"
done
"$OUT/spire-server" --version >&2 || true
echo "$OUT"
