# Least-privilege Vault policy of an nvmegate gateway, for the default
# mounts (KV v2 at secret/, Transit at transit/) and prefix (nvmegate).
# Change the three together if you change them in the gateway's config.

# Access-credential roots and wrapped data keys: read, create, and
# check-and-set updates. No delete, no destroy, no metadata writes: history
# stays in Vault.
path "secret/data/nvmegate/*" {
  capabilities = ["create", "read", "update"]
}

# Listing the subsystems that have roots (the key manager warms its cache).
path "secret/metadata/nvmegate/roots" {
  capabilities = ["list"]
}
path "secret/metadata/nvmegate/roots/" {
  capabilities = ["list"]
}

# Per-namespace key-encryption keys: create, read versions, rotate; make,
# unwrap and rewrap data keys. The gateway can never export or delete them.
path "transit/keys/nvmegate-ns-*" {
  capabilities = ["create", "read", "update"]
}
path "transit/datakey/wrapped/nvmegate-ns-*" {
  capabilities = ["update"]
}
path "transit/decrypt/nvmegate-ns-*" {
  capabilities = ["update"]
}
path "transit/rewrap/nvmegate-ns-*" {
  capabilities = ["update"]
}

# The audit log's checkpoint signing key (audit.vault.key): read its public
# versions and sign. Rotating it is an operator's act, not the gateway's.
path "transit/keys/nvmegate-audit" {
  capabilities = ["read"]
}
path "transit/sign/nvmegate-audit" {
  capabilities = ["update"]
}
path "transit/sign/nvmegate-audit/*" {
  capabilities = ["update"]
}

# Token self-management for renewal.
path "auth/token/renew-self" {
  capabilities = ["update"]
}
path "auth/token/lookup-self" {
  capabilities = ["read"]
}
