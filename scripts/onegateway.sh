#!/usr/bin/env bash
# One gateway, builds side by side in one sitting (docs/PERFORMANCE.md quotes
# its output): for each build, alternately, ROUNDS times, a fresh dev gateway
# (local keys, the nvmet tree on a tmpfs) and
#
#   - the trivial floor at C in flight (a health check on a bare gRPC server
#     in a process of its own, over each node's mTLS connection), then
#     nvmegate's Connect at C: rate, p99, and the CPU per call of the server
#     process — the floor server's and the gateway's, each read from
#     /proc/PID/stat over the middle half of its load window (not by
#     difference);
#   - with OPEN=1, open loop at 1,000 and 2,000 calls/s (floor, then connect);
#   - with STORM=N, N nodes of one job at once, each on a new connection,
#     after the storm of trivial calls.
#
#   scripts/onegateway.sh                         # this tree alone
#   scripts/onegateway.sh /tmp/before /tmp/after  # directories holding nvmegated and nvmegate
#   ROUNDS=3 OPEN=1 STORM=10000 scripts/onegateway.sh /tmp/before /tmp/after
#
# Build an older commit's binaries with
#   git worktree add /tmp/wt REV && (cd /tmp/wt && go build -o /tmp/before/ ./cmd/nvmegated ./cmd/nvmegate)
set -euo pipefail
cd "$(dirname "$0")/.."
C=${C:-32} D=${D:-16s} N=${N:-1000} M=${M:-8} ROUNDS=${ROUNDS:-1} OPEN=${OPEN:-0} STORM=${STORM:-0}

work="$(mktemp -d)"
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
builds=("$@")
if [ ${#builds[@]} -eq 0 ]; then
  go build -o "$work/this/" ./cmd/nvmegated ./cmd/nvmegate
  builds=("$work/this")
fi
tck=$(getconf CLK_TCK)
secs=${D%s}
case "$secs" in *[!0-9]*) echo "D must be whole seconds (e.g. 16s)" >&2; exit 2 ;; esac
lead=$((secs / 4)) window=$((secs / 2))
cpu() { awk '{print $14+$15}' "/proc/$1/stat"; }

# one BIN NAME: a fresh gateway, then the runs.
one() {
  local bin=$1 name=$2 dir="$work/$2" root gp
  mkdir -p "$dir"
  root=$(mktemp -d "${TMPDIR_SHM:-/dev/shm}/nvmegate-bench.XXXXXX" 2>/dev/null || mktemp -d)
  printf 'targets:\n  nvmet_root: %s\n' "$root" >"$dir/cfg.yaml"
  "$bin/nvmegated" dev --dir "$dir/dev" --config "$dir/cfg.yaml" --listen 127.0.0.1:0 --http-listen off 2>"$dir/gw.log" &
  gp=$!
  for _ in $(seq 300); do [ -f "$dir/dev/gateway.json" ] && break; sleep 0.1; done
  bench() { "$bin/nvmegate" --dev-dir "$dir/dev" --dev-identity admin --timeout 120s bench connect --nodes "$N" --namespaces "$M" "$@"; }
  # closed CALL PIDCMD: a run at C with the server's CPU sampled.
  closed() {
    local call=$1 pidcmd=$2 out="$dir/$1.txt" a b p rate p99
    ( sleep $((lead + 1)); p=$(eval "$pidcmd"); a=$(cpu "$p"); sleep "$window"; b=$(cpu "$p"); echo "$a $b" >"$dir/$call.cpu" ) &
    local sp=$!
    bench --concurrency "$C" --duration "$D" --call "$call" >"$out" 2>&1
    wait $sp
    rate=$(sed -n 's/.* = \([0-9]*\) [a-z]*\/s.*/\1/p' "$out" | tail -1)
    p99=$(grep '^latency' "$out" | tail -1 | sed -n 's/.*p99 \([0-9.]*[mµ]\?s\) .*/\1/p')
    read -r a b <"$dir/$call.cpu"
    printf '%-8s %-8s %6s/s  p99 %-10s server CPU %4s µs/call  errors %s\n' "$name" "$call" "$rate" "$p99" \
      "$(python3 -c "print(round(($b-$a)/$tck/$window/$rate*1e6))")" "$(grep '^errors' "$out" | tail -1 | awk '{print $2}')"
  }
  closed trivial "pgrep -f 'bench floor-server' | head -1"
  closed connect "echo $gp"
  if [ "$OPEN" = 1 ]; then
    local rate
    for rate in 1000 2000; do
      if bench --rate "$rate" --duration 15s --call trivial,connect >"$dir/open$rate.txt" 2>&1; then
        echo "$name   open loop $rate/s: $(grep '^ratio' "$dir/open$rate.txt")"
      else
        echo "$name   open loop $rate/s: not run ($(head -1 "$dir/open$rate.txt"))"
      fi
    done
  fi
  if [ "$STORM" -gt 0 ]; then
    "$bin/nvmegate" --dev-dir "$dir/dev" --dev-identity admin --timeout 120s bench connect --nodes "$STORM" --job-size "$STORM" \
      --namespaces "$M" --storm --call trivial,connect >"$dir/storm.txt" 2>&1 || true
    echo "$name   storm of $STORM: $(grep '^ratio' "$dir/storm.txt"); errors $(grep '^errors' "$dir/storm.txt" | tail -1 | awk '{print $2}'); gateway RSS max $(awk '/VmHWM/ {printf "%d MiB", $2/1024}' "/proc/$gp/status")"
  fi
  kill "$gp"; wait "$gp" 2>/dev/null || true
  rm -rf "$root" "$dir"
}

echo "== one gateway: C=$C D=$D N=$N M=$M, $(nproc) cores, client on the same machine"
for round in $(seq "$ROUNDS"); do
  for b in "${builds[@]}"; do
    one "$b" "$(basename "$b")-$round"
  done
done
