#!/usr/bin/env bash
# Prepares a Vault for nvmegate: mounts (KV v2 at secret/, Transit at
# transit/ for the signing key and at nvmegate-kek/ for the namespace KEKs
# alone), the least-privilege policy (nvmegate.hcl), the audit log's
# signing key, and a login for the gateway:
#
#   deploy/vault/setup.sh approle OUT_DIR          # role_id and secret_id files in OUT_DIR
#   deploy/vault/setup.sh cert BUNDLE.pem TRUST_DOMAIN
#                                                  # cert auth: the gateway logs in with its SVID
#
# Needs the vault CLI with VAULT_ADDR and a token allowed to configure Vault
# (VAULT_TOKEN). Idempotent: re-running changes nothing that is in place.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

# (Lists are read into variables first: with pipefail, grep -q closing the
# pipe early would fail the pipeline.)
enable() { # enable TYPE PATH [ARGS...]
  local type=$1 path=$2; shift 2
  local mounts; mounts=$(vault secrets list -format=json)
  case "$mounts" in
    *"\"$path/\""*) ;;
    *) vault secrets enable -path="$path" "$@" "$type" ;;
  esac
}
auth_enabled() { local auths; auths=$(vault auth list -format=json); case "$auths" in *"\"$1/\""*) return 0 ;; esac; return 1; }
enable kv secret -version=2
enable transit transit
enable transit nvmegate-kek
vault policy write nvmegate "$here/nvmegate.hcl"
vault write -f transit/keys/nvmegate-audit type=ed25519 >/dev/null

case "${1:-}" in
  approle)
    out=${2:?usage: setup.sh approle OUT_DIR}
    auth_enabled approle || vault auth enable approle
    vault write auth/approle/role/nvmegate token_policies=nvmegate token_ttl=1h token_max_ttl=24h secret_id_ttl=0
    mkdir -p "$out"
    vault read -field=role_id auth/approle/role/nvmegate/role-id > "$out/role_id"
    (umask 077; vault write -f -field=secret_id auth/approle/role/nvmegate/secret-id > "$out/secret_id")
    echo "role_id and secret_id written to $out (approle: {role_id: $(cat "$out/role_id"), secret_id_file: $out/secret_id})"
    ;;
  cert)
    bundle=${2:?usage: setup.sh cert BUNDLE.pem TRUST_DOMAIN}
    td=${3:?usage: setup.sh cert BUNDLE.pem TRUST_DOMAIN}
    auth_enabled cert || vault auth enable cert
    # Only the trust domain's gateways: SVIDs carry their SPIFFE ID as a URI SAN.
    vault write auth/cert/certs/nvmegate certificate=@"$bundle" \
      allowed_uri_sans="spiffe://$td/gateway/*" token_policies=nvmegate token_ttl=1h token_max_ttl=24h
    ;;
  *)
    echo "mounts, policy and signing key in place; add a login with: setup.sh approle DIR | setup.sh cert BUNDLE TD" >&2
    ;;
esac
