#!/usr/bin/env bash
# Builds the HashiCorp Vault server once per machine from the Go module
# proxy, into a cache directory keyed by version, and prints its path.
# Vault's dependencies stay in a throwaway module, out of our go.mod.
#
#   scripts/build-vault.sh            # prints .../vault-v1.21.0/vault
#   NVMEGATE_VAULT=$(scripts/build-vault.sh) go test ./attest ./keys/...
#
# About 20 CPU-minutes and a 500 MB binary on a fresh machine; instant after.
set -euo pipefail

VERSION="${VAULT_VERSION:-v1.21.0}"
CACHE="${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/tools}"
OUT="$CACHE/vault-$VERSION/vault"

if [ -x "$OUT" ] && "$OUT" version 2>/dev/null | grep -q "Vault ${VERSION}"; then
  echo "$OUT"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > go.mod <<MOD
module vaultbuild

go 1.25

require github.com/hashicorp/vault ${VERSION}

// The replaces Vault's own go.mod carries (they do not apply to a module
// that depends on it).
replace github.com/99designs/keyring => github.com/Jeffail/keyring v1.2.3

replace github.com/ma314smith/signedxml v1.1.1 => github.com/moov-io/signedxml v1.1.1
MOD
echo "building Vault ${VERSION} into $OUT (about 20 CPU-minutes the first time)" >&2
mkdir -p "$(dirname "$OUT")"
GOFLAGS=-mod=mod GOWORK=off go build -trimpath -o "$OUT.tmp" github.com/hashicorp/vault >&2
mv "$OUT.tmp" "$OUT"
"$OUT" version >&2
echo "$OUT"
