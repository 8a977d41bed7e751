#!/usr/bin/env bash
# Side-by-side benchmarks in one run (docs/PERFORMANCE.md quotes its output):
#
#  (a) nvmegate's Connect, end to end (`nvmegate bench connect`: N node
#      SVIDs, mTLS each, policy, derivation, target programming, durable
#      audit entry), against its floors measured just before on the same
#      fleet, same N and C — a trivial call (a health Check on a bare gRPC
#      server of its own process, over N mTLS connections: the issue's
#      floor) and a health Check on the gateway (through its interceptors
#      and a policy decision) — and
#      against the naive composition of the same work
#      (internal/cmd/naivebench: an OPA server decision over HTTP with the
#      same Rego, a Vault KV read, a Vault Transit HMAC, a bbolt append with
#      fsync) — same concurrency, duration and namespaces, same machine,
#      both against the same real Vault dev server; then the storm: all N
#      nodes at once, each a new mTLS connection, after its floors (N bare
#      mTLS handshakes to the gateway, all at once; N trivial calls, each
#      on a new gRPC connection, all at once);
#  (b) nvmegate's audit append (audit BenchmarkAppend) against Tessera's
#      POSIX driver at 16 and 256 appenders, same entry size;
#  (c) with HA=1, replicas (e2e BenchmarkReplicaConnects, BenchmarkReplicaStorm):
#      one bbolt gateway, then 1, 2 and 3 replicas on a 3-member etcd, with
#      CPU per grant by process, the issue's ratios, and the storm through
#      three replicas against three floor servers.
#
#   scripts/sidebyside.sh            # C=32 D=20s N=1000 M=8
#   STORM=10000 scripts/sidebyside.sh   # the storm with 10,000 nodes (default N)
#   C=64 D=30s scripts/sidebyside.sh
#   HA=1 scripts/sidebyside.sh          # and (c): replicas on etcd, their storm (needs Vault)
#
# Needs the opa CLI and Vault that `make test` caches; builds the Tessera
# program once in a throwaway module (Tessera is not our dependency).
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-32} D=${D:-20s} N=${N:-1000} M=${M:-8} STORM=${STORM:-$N}
CACHE="${TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvmegate/tools}"
OPA="$CACHE/opa-$(go list -m -f '{{.Version}}' github.com/open-policy-agent/opa)/opa"
VAULT="$(scripts/build-vault.sh)"
[ -x "$OPA" ] || { echo "no opa CLI at $OPA: run make test once" >&2; exit 1; }
TESSERA_VERSION=v1.0.4
TESSERA="$CACHE/tessera-bench-$TESSERA_VERSION/tessera-bench"

work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hwm() { awk '/VmHWM/ {printf "%d MiB", $2/1024}' "/proc/$1/status"; }

go build -o "$work/bin/" ./cmd/... ./internal/cmd/naivebench
if [ ! -x "$TESSERA" ]; then
  mkdir -p "$work/tessera" "$(dirname "$TESSERA")"
  cp scripts/sidebyside/tessera.go.txt "$work/tessera/main.go"
  (cd "$work/tessera" && go mod init tesserabench >/dev/null 2>&1 &&
    GOFLAGS=-mod=mod go get "github.com/transparency-dev/tessera@$TESSERA_VERSION" golang.org/x/mod >/dev/null 2>&1 &&
    GOFLAGS=-mod=mod go build -o "$TESSERA" .)
fi

vport=$(port); oport=$(port)
"$VAULT" server -dev -dev-root-token-id=root -dev-listen-address="127.0.0.1:$vport" >"$work/vault.log" 2>&1 &
pids+=($!); vpid=$!
"$OPA" run --server --addr "127.0.0.1:$oport" --log-level error policy/ >"$work/opa.log" 2>&1 &
pids+=($!); opid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$vport/v1/sys/health" >/dev/null && curl -sf "http://127.0.0.1:$oport/health" >/dev/null && break
  sleep 0.2
done

echo "== (a) one grant: nvmegate vs the naive composition — C=$C in flight for $D, $M namespaces, $(nproc) cores, client on the same machine"
echo "-- naive: OPA server (HTTP) + Vault KV read + Vault Transit HMAC + bbolt append (fsync)"
"$work/bin/naivebench" --opa "http://127.0.0.1:$oport" --vault "http://127.0.0.1:$vport" --token root \
  --namespaces "$M" --concurrency "$C" --duration "$D" --db "$work/naive.db" | tee "$work/naive.txt"
echo "   server RSS (max): opa $(hwm $opid), vault $(hwm $vpid)"

echo "-- nvmegate: nvmegated (keys in the same Vault) + nvmegate bench connect, $N node identities"
# The dev target's nvmet tree stands in for configfs, which lives in the
# kernel's memory: keep it in memory too (a tmpfs), or every host a connect
# adds costs this shared disk's file creation and journal instead.
nvmet_root="$work/configfs"
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  nvmet_root="$(mktemp -d /dev/shm/nvmegate-bench.XXXXXX)"
  trap 'cleanup; rm -rf "$nvmet_root"' EXIT
fi
printf 'keys:\n  backend: vault\n  vault:\n    address: http://127.0.0.1:%s\n    token_file: %s\ntargets:\n  nvmet_root: %s\n' \
  "$vport" "$work/token" "$nvmet_root" > "$work/nvmegated.yaml"
echo "   the target's nvmet tree: $nvmet_root"
printf root > "$work/token"
"$work/bin/nvmegated" dev --dir "$work/dev" --config "$work/nvmegated.yaml" --listen 127.0.0.1:0 --http-listen off 2>"$work/gateway.log" &
pids+=($!); gpid=$!
for _ in $(seq 300); do [ -f "$work/dev/gateway.json" ] && break; sleep 0.1; done
"$work/bin/nvmegate" --dev-dir "$work/dev" --dev-identity admin bench connect --nodes "$N" --namespaces "$M" \
  --concurrency "$C" --duration "$D" --call trivial,health,connect | tee "$work/nvmegate.txt"
echo "   server RSS (max): nvmegated $(hwm $gpid)"
rate() { sed -n 's/.*= \([0-9]*\) grants\/s.*/\1/p' "$1"; }
p99() { grep "^latency" "$1" | tail -1 | sed -n 's/.*p99 \([0-9.]*m\?s\) .*/\1/p'; }
echo "   ratio nvmegate/naive: grants/s $(rate "$work/nvmegate.txt")/$(rate "$work/naive.txt") = $(python3 -c "print(round($(rate "$work/nvmegate.txt")/$(rate "$work/naive.txt"),2))"); p99 $(p99 "$work/nvmegate.txt") vs $(p99 "$work/naive.txt")"
echo "-- nvmegate storm: all $STORM nodes at once, each a new mTLS connection, after two floors: bare handshakes, and a trivial call on a new gRPC connection"
"$work/bin/nvmegate" --dev-dir "$work/dev" --dev-identity admin --timeout 60s bench connect --nodes "$STORM" --job-size "$STORM" \
  --namespaces "$M" --storm --call handshake,trivial,connect
echo "   server RSS (max): nvmegated $(hwm $gpid)"

echo
echo "== (b) audit append vs Tessera POSIX (20,000 entries of ~840 bytes, fsync'd)"
go test -run '^$' -bench 'Append/appenders=(16|256)$' -benchtime 20000x ./audit | grep '^Benchmark'
# Tessera with its default batching (250 ms) and with 5 ms batches. At 16
# appenders with the default, each append waits for its batch's age: 1,000
# entries (not 20,000) keep that run to ~15 s.
for w in 16 256; do
  for age in 250ms 5ms; do
    n=20000
    [ "$w/$age" = 16/250ms ] && n=1000
    rm -rf "$work/tlog"
    "$TESSERA" --dir "$work/tlog" --appenders "$w" --n "$n" --size 840 --batch-max-age "$age" 2>/dev/null
  done
done

if [ "${HA:-0}" = 1 ]; then
  # (c) Replicas: the e2e benchmarks with a 3-member etcd of real processes
  # and Vault keys, everything on this machine's cores. Each variant reports
  # grants/s, p99 and CPU per grant read from /proc (the gateways, etcd, and
  # the whole box with the load generator); the storm runs one job's nodes
  # through three replicas against a trivial storm on three floor servers.
  echo
  echo "== (c) replicas: one bbolt gateway, then 1, 2 and 3 replicas on a 3-member etcd, $(nproc) cores"
  export NVMEGATE_VAULT="$VAULT"
  NVMEGATE_BENCH_VARIANTS=bbolt,etcd/replicas=1,etcd/replicas=2,etcd/replicas=3 \
    go test -run '^$' -bench ReplicaConnects -benchtime 1x -timeout 30m ./e2e/ 2>/dev/null | grep '^Benchmark' | tee "$work/ha.txt"
  metric() { grep "ReplicaConnects/$1-" "$work/ha.txt" | tr '\t' '\n' | sed -n "s|^ *\([0-9.]*\) $2\$|\1|p"; }
  python3 - "$(metric bbolt grants/s)" "$(metric etcd/replicas=1 grants/s)" "$(metric etcd/replicas=2 grants/s)" "$(metric etcd/replicas=3 grants/s)" \
    "$(metric bbolt box-cpu-ms/grant)" "$(metric etcd/replicas=3 box-cpu-ms/grant)" <<'PY'
import sys
b, r1, r2, r3, cb, c3 = map(float, sys.argv[1:])
print(f"   three replicas / one bbolt gateway: {r3/b:.2f}x (target >= 0.6x)")
print(f"   one -> two replicas: {r2/r1:.2f}x, two -> three: {r3/r2:.2f}x (target >= 0.9x each)")
print(f"   whole-box CPU per grant, three replicas / one gateway: {c3:.2f} / {cb:.2f} ms = {c3/cb:.2f}x (target <= 1.6x)")
PY
  go test -run '^$' -bench ReplicaStorm -benchtime 1x -timeout 30m ./e2e/ 2>/dev/null | grep -E '^Benchmark|storm_test' | tee "$work/hastorm.txt"
fi
