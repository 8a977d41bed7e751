#!/usr/bin/env bash
# A throwaway Vault dev server on 127.0.0.1, for trying nvmegate's vault
# key backend and signer by hand (the Go tests start their own through
# internal/vaulttest):
#
#   scripts/vault-dev.sh start DIR   # random port and root token; writes DIR/env
#   . DIR/env                        # VAULT_ADDR, VAULT_TOKEN for the vault CLI
#   deploy/vault/setup.sh approle DIR/approle
#   scripts/vault-dev.sh stop DIR
#
# The binary comes from scripts/build-vault.sh (built once per machine).
# Dev mode keeps everything in memory: stop loses it all.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cmd=${1:?usage: vault-dev.sh start|stop DIR}
dir=${2:?usage: vault-dev.sh start|stop DIR}

case "$cmd" in
  start)
    vault="$("$here/build-vault.sh")"
    mkdir -p "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
      echo $((20000 + RANDOM % 20000)))
    token="root-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    HOME="$dir" "$vault" server -dev -dev-no-store-token -dev-root-token-id="$token" \
      -dev-listen-address="127.0.0.1:$port" >"$dir/vault.log" 2>&1 &
    echo $! >"$dir/vault.pid"
    (umask 077; printf 'export VAULT_ADDR=http://127.0.0.1:%s\nexport VAULT_TOKEN=%s\n' "$port" "$token" >"$dir/env")
    export VAULT_ADDR="http://127.0.0.1:$port" VAULT_TOKEN="$token"
    for _ in $(seq 100); do
      "$vault" status >/dev/null 2>&1 && break
      sleep 0.1
    done
    "$vault" status >/dev/null || { echo "vault did not start; see $dir/vault.log" >&2; exit 1; }
    "$vault" secrets enable transit >/dev/null
    "$vault" secrets enable -path=nvmegate-kek transit >/dev/null
    echo "vault dev server on $VAULT_ADDR (pid $(cat "$dir/vault.pid")); . $dir/env to use it"
    ;;
  stop)
    [ -f "$dir/vault.pid" ] || { echo "no vault.pid in $dir" >&2; exit 1; }
    kill "$(cat "$dir/vault.pid")" 2>/dev/null || true
    rm -f "$dir/vault.pid" "$dir/env"
    echo "stopped"
    ;;
  *) echo "usage: vault-dev.sh start|stop DIR" >&2; exit 2 ;;
esac
