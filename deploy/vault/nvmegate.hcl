# Least-privilege Vault policy of an nvmegate gateway, for the default
# mounts (KV v2 at secret/, the KEK Transit mount at nvmegate-kek/, the
# signing key in transit/) and prefix (nvmegate). Change them together if
# you change them in the gateway's config.
#
# "+" matches exactly one path segment: nvmegate-kek/keys/+ is a key, never
# its /trim or /export, which the gateway must not reach (it could export a
# KEK or destroy old versions piecemeal); of /config it may set
# deletion_allowed only, for crypto-erase. That is why the KEKs have a
# Transit mount of their own.

# Access-credential roots and wrapped data keys: read, create, and
# check-and-set updates. No delete, no destroy, no metadata writes: history
# stays in Vault — but for a crypto-erased namespace's wrapped data key,
# whose KEK is deleted first (below): its history goes too.
path "secret/data/nvmegate/*" {
  capabilities = ["create", "read", "update"]
}
path "secret/metadata/nvmegate/deks/*" {
  capabilities = ["delete"]
}

# Listing the subsystems that have roots (the key manager warms its cache).
path "secret/metadata/nvmegate/roots/" {
  capabilities = ["list"]
}

# Per-namespace key-encryption keys: create (a write to keys/<name>),
# read versions, rotate; make, unwrap and rewrap data keys.
path "nvmegate-kek/keys/+" {
  capabilities = ["read", "update", "delete"]
}
# Crypto-erase (namespace remove --erase): a KEK may be made deletable and
# then deleted. Only deletion_allowed may be set on its config: never
# exportable, never plaintext backup.
path "nvmegate-kek/keys/+/config" {
  capabilities = ["update"]
  allowed_parameters = {
    "deletion_allowed" = ["true"]
  }
}
path "nvmegate-kek/keys/+/rotate" {
  capabilities = ["update"]
}
path "nvmegate-kek/datakey/wrapped/+" {
  capabilities = ["update"]
}
path "nvmegate-kek/decrypt/+" {
  capabilities = ["update"]
}
path "nvmegate-kek/rewrap/+" {
  capabilities = ["update"]
}

# The audit log's checkpoint signing key (audit.vault.key): read its public
# versions and sign (ed25519 at sign/<key>, ECDSA at sign/<key>/sha2-256).
# Rotating it is an operator's act, not the gateway's.
path "transit/keys/nvmegate-audit" {
  capabilities = ["read"]
}
path "transit/sign/nvmegate-audit" {
  capabilities = ["update"]
}
path "transit/sign/nvmegate-audit/sha2-256" {
  capabilities = ["update"]
}

# Token self-management for renewal.
path "auth/token/renew-self" {
  capabilities = ["update"]
}
path "auth/token/lookup-self" {
  capabilities = ["read"]
}
