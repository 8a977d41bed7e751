#!/usr/bin/env bash
# The nvmegate demo: a dev gateway under .demo/ and a scripted scenario run
# through the CLI as different SPIFFE identities. Every step states what must
# happen; any surprise stops the demo with a non-zero exit.
#
# Usage: scripts/demo.sh   (make demo builds bin/ first)
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin}
DEMO=${DEMO_DIR:-.demo}
# SPIFFE_SOCKET (a SPIRE agent's Workload API, unix:///…) runs the same story
# on SVIDs from SPIRE instead of the dev CA: the gateway, the target agent
# and every CLI call pick their SVID by ID. SPIFFE_IDS maps each identity
# name to its ID ("admin=spiffe://… auditor=spiffe://…"; the e2e SPIRE test
# registers the dev identities' IDs and passes them).
SPIFFE_SOCKET=${SPIFFE_SOCKET:-}
declare -A ID=()
for kv in ${SPIFFE_IDS:-}; do ID[${kv%%=*}]=${kv#*=}; done
ADDR=""
rm -rf "$DEMO"
mkdir -p "$DEMO"
log="$DEMO/gateway.log"

steps=0
ok_steps=0
refused_steps=0
fail() { echo "DEMO FAILED: $*" >&2; [ -f "$log" ] && { echo "--- gateway log (tail) ---" >&2; tail -n 20 "$log" >&2; }; exit 1; }

# as NAME ARGS...: run the CLI as identity NAME.
as() {
  local who=$1; shift
  if [ -n "$SPIFFE_SOCKET" ]; then
    "$BIN/nvmegate" --spiffe-socket "$SPIFFE_SOCKET" --spiffe-id "${ID[$who]:?no SPIFFE ID for $who in SPIFFE_IDS}" --addr "$ADDR" "$@"
  else
    "$BIN/nvmegate" --dev-dir "$DEMO" --dev-identity "$who" "$@"
  fi
}

# ok WHAT -- CMD...: CMD must succeed.
ok() {
  local what=$1; shift 2
  steps=$((steps + 1))
  printf '%2d. %s\n' "$steps" "$what"
  local out
  if ! out=$("$@" 2>&1); then fail "step $steps ($what): expected success, got:
$out"; fi
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/      /'
  ok_steps=$((ok_steps + 1))
}

# refused WHAT CODE -- CMD...: CMD must fail with gRPC code CODE.
refused() {
  local what=$1 code=$2; shift 3
  steps=$((steps + 1))
  printf '%2d. %s\n' "$steps" "$what"
  local out
  if out=$("$@" 2>&1); then fail "step $steps ($what): expected $code, but it succeeded:
$out"; fi
  case "$out" in
    *"$code"*) printf '      refused as expected: %s\n' "$out"; refused_steps=$((refused_steps + 1)) ;;
    *) fail "step $steps ($what): expected $code, got:
$out" ;;
  esac
}

# decides WHAT VERDICT -- CMD...: CMD (a policy dry run) must print VERDICT
# (ALLOW or DENY) first.
decides() {
  local what=$1 want=$2; shift 3
  steps=$((steps + 1))
  printf '%2d. %s\n' "$steps" "$what"
  local out
  out=$("$@" 2>&1) || fail "step $steps ($what): the dry run failed:
$out"
  case "$out" in
    "$want"*) printf '%s\n' "$out" | sed 's/^/      /'; ok_steps=$((ok_steps + 1)) ;;
    *) fail "step $steps ($what): expected $want, got:
$out" ;;
  esac
}

echo "== starting the dev gateway (trust domain nvmegate.test, state in $DEMO)"
# The security team's policy directory, hot-reloaded: the shipped policy.
mkdir -p "$DEMO/policy"
cp policy/*.rego policy/*.json "$DEMO/policy/" && rm -f "$DEMO/policy/"*_test.rego
POLICY_FLAGS=(--policy-dir "$DEMO/policy" --policy-reload-interval 1s)
# stor-eu-1 is programmed by its own target agent (started below), never by
# the gateway's embedded one.
if [ -n "$SPIFFE_SOCKET" ]; then
  echo "   (SVIDs from the SPIFFE Workload API at $SPIFFE_SOCKET)"
  "$BIN/nvmegated" --spiffe-socket "$SPIFFE_SOCKET" --spiffe-id "${ID[gateway]:?no SPIFFE ID for the gateway}" \
    --trust-domain nvmegate.test --state-dir "$DEMO/state" --ready-file "$DEMO/gateway.json" \
    --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log-format json --remote-targets stor-eu-1 "${POLICY_FLAGS[@]}" 2>"$log" &
else
  "$BIN/nvmegated" dev --dir "$DEMO" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --log-format json \
    --remote-targets stor-eu-1 "${POLICY_FLAGS[@]}" 2>"$log" &
fi
gw=$!
trap 'kill "$gw" 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  [ -f "$DEMO/gateway.json" ] && break
  kill -0 "$gw" 2>/dev/null || fail "the gateway exited during start-up"
  sleep 0.1
done
[ -f "$DEMO/gateway.json" ] || fail "the gateway did not become ready in 30 s"
echo "   ready: $(cat "$DEMO/gateway.json")"
ADDR=$(sed -n 's/.*"grpc": *"\([^"]*\)".*/\1/p' "$DEMO/gateway.json")

ACME=nqn.2026-01.io.nvmegate.demo:acme-train
GLOBEX=nqn.2026-01.io.nvmegate.demo:globex-ckpt
DIGEST_A=sha256:$(printf 'common-crawl/2026-10' | sha256sum | cut -d' ' -f1)
DIGEST_B=sha256:$(printf 'globex-checkpoints' | sha256sum | cut -d' ' -f1)

echo "== the admin registers two tenants' inventory in two regions"
ok "admin adds target stor-eu-1 (eu-west, nvmet)" -- \
  as admin inventory target add stor-eu-1 --fabric fab-eu --region eu-west --driver nvmet \
    --port id=1,transport=tcp,family=ipv4,address=127.0.0.1,service=4420
ok "admin adds target stor-us-1 (us-east, nvmet, TLS port)" -- \
  as admin inventory target add stor-us-1 --fabric fab-us --region us-east --driver nvmet \
    --port id=1,transport=tcp,family=ipv4,address=127.0.0.2,service=4420 \
    --port id=2,transport=tcp,family=ipv4,address=127.0.0.2,service=4421,secure=required
ok "admin adds acme's subsystem on stor-eu-1" -- \
  as admin inventory subsystem add "$ACME" --target stor-eu-1 --tenant acme --ports 1 --dhchap
ok "admin adds globex's subsystem on stor-us-1" -- \
  as admin inventory subsystem add "$GLOBEX" --target stor-us-1 --tenant globex --ports 1,2 --dhchap --tls
ok "admin adds acme's dataset namespace" -- \
  as admin inventory namespace add "$ACME" 1 --tenant acme --region eu-west --class internal \
    --dataset common-crawl/2026-10 --digest "$DIGEST_A"
ok "admin adds globex's checkpoint namespace (restricted)" -- \
  as admin inventory namespace add "$GLOBEX" 1 --tenant globex --region us-east --class restricted \
    --dataset globex/checkpoints --digest "$DIGEST_B"
for n in 1 2; do
  # acme's nodes use the host NQN derived from their SPIFFE ID; globex's have
  # explicit ones.
  nqn=$("$BIN/nvmegate" hostnqn "spiffe://nvmegate.test/node/acme-gpu-$n") || fail "hostnqn derivation"
  ok "admin binds acme-node-$n to its derived host NQN" -- \
    as admin inventory host add "spiffe://nvmegate.test/node/acme-gpu-$n" --nqn "$nqn" --tenant acme
  ok "admin binds globex-node-$n to its host NQN" -- \
    as admin inventory host add "spiffe://nvmegate.test/node/globex-gpu-$n" \
      --nqn "nqn.2014-08.org.nvmexpress:uuid:0000000$n-bbbb-4000-8000-000000000000" --tenant globex
done
ok "admin lists the namespaces" -- as admin inventory namespace list
ok "admin lists the host bindings" -- as admin inventory host list

echo "== the rules hold"
refused "a globex namespace in acme's subsystem is refused (one tenant per subsystem)" InvalidArgument -- \
  as admin inventory namespace add "$ACME" 2 --tenant globex --region eu-west --class internal \
    --dataset x --digest "$DIGEST_B"
refused "a namespace cannot claim a region its target is not in" "namespace.region" -- \
  as admin inventory namespace add "$ACME" 3 --tenant acme --region us-east --class internal \
    --dataset x --digest "$DIGEST_A"
refused "a second identity cannot take globex-node-1's host NQN" FailedPrecondition -- \
  as admin inventory host add spiffe://nvmegate.test/node/intruder \
    --nqn nqn.2014-08.org.nvmexpress:uuid:00000001-bbbb-4000-8000-000000000000
refused "a node cannot change the inventory" PermissionDenied -- \
  as acme-node-1 inventory target add rogue --fabric fab-eu --region eu-west \
    --port id=1,transport=tcp,family=ipv4,address=10.9.9.9,service=4420
ok "acme's scheduler reads acme's subsystems" -- as acme-scheduler inventory subsystem list --tenant acme
refused "acme's scheduler cannot read globex's subsystems (tenant isolation)" PermissionDenied -- \
  as acme-scheduler inventory subsystem list --tenant globex
refused "a malformed NQN is refused naming the field" "subsystem.nqn" -- \
  as admin inventory subsystem add not-an-nqn --target stor-eu-1 --tenant acme --ports 1 --dhchap
ok "the policy revision in force" -- as admin policy status

echo "== acme's scheduler admits a training job (the scope its nodes will connect under)"
ok "acme's scheduler admits job llm-pretrain-1: three nodes, acme's dataset read-only, eu-west, 12 h" -- \
  as acme-scheduler job admit llm-pretrain-1 --tenant acme \
    --node spiffe://nvmegate.test/node/acme-gpu-1 --node spiffe://nvmegate.test/node/acme-gpu-2 \
    --node spiffe://nvmegate.test/node/acme-gpu-3 \
    --namespace "$ACME/1:ro" --region eu-west --expires-in 12h
refused "... but not a job on globex's dataset (tenant isolation)" PermissionDenied -- \
  as acme-scheduler job admit llm-pretrain-2 --tenant acme \
    --node spiffe://nvmegate.test/node/acme-gpu-1 --namespace "$GLOBEX/1:ro" --region us-east
refused "... nor one reading acme's eu-west dataset from us-east (residency)" PermissionDenied -- \
  as acme-scheduler job admit llm-pretrain-3 --tenant acme \
    --node spiffe://nvmegate.test/node/acme-gpu-1 --namespace "$ACME/1:ro" --region us-east
refused "globex's scheduler cannot read acme's job" PermissionDenied -- as globex-scheduler job get llm-pretrain-1
ok "acme's scheduler lists its active jobs" -- as acme-scheduler job list --tenant acme --state active

echo "== a scheduler's hooks retry and requeue: the API made for them (docs/slurm.md)"
slurm_expiry=$(date -u -d '+6 hours' +%Y-%m-%dT%H:00:00Z)
slurm_job() { as acme-scheduler job admit 4242 --tenant acme --hostlist 'acme-gpu-[1-2]' --user alice \
  --namespace "$ACME/1:ro" --region eu-west --expires-at "$slurm_expiry" "$@"; }
ok "acme's scheduler admits Slurm job 4242, its nodes as a hostlist (acme-gpu-[1-2])" -- slurm_job
ok "... and its prolog's retry gets the same answer (admission is idempotent)" -- slurm_job
refused "the same job ID with another scope is refused, saying how" AlreadyExists -- slurm_job --generation 0 --hostlist 'acme-gpu-[1-3]'
ok "the job is requeued: generation 1 is admitted, generation 0 ends first" -- slurm_job --generation 1
refused "a late admission of generation 0 is refused" FailedPrecondition -- slurm_job --generation 0
ok "the elastic job loses acme-gpu-2 (its grants would end)" -- \
  as acme-scheduler job nodes 4242 --generation 1 --remove-hostlist acme-gpu-2
ok "the epilog finishes generation 1" -- as acme-scheduler job finish 4242 --generation 1
ok "... and its retry answers the job as it ended" -- as acme-scheduler job finish 4242 --generation 1
ok "acme-node-1 discovers the job's subsystem ports and its host NQN" -- as acme-node-1 discover --job llm-pretrain-1
refused "globex-node-1 learns nothing about acme's job" PermissionDenied -- as globex-node-1 discover --job llm-pretrain-1

echo "== the nodes connect: credentials derived, the target programmed, the grant audited — then the answer"
# stor-eu-1's own target agent, a separate process with the target's SVID,
# as on a storage server: it streams its target's state and writes the nvmet
# tree (here a directory instead of /sys/kernel/config/nvmet).
CFS="$DEMO/storage-server-eu-1/nvmet"
if [ -n "$SPIFFE_SOCKET" ]; then
  "$BIN/nvmegate-target" --spiffe-socket "$SPIFFE_SOCKET" --spiffe-id "${ID[target-stor-eu-1]:?no SPIFFE ID for target-stor-eu-1}" \
    --addr "$ADDR" --nvmet-root "$CFS" > "$DEMO/target-agent.log" 2>&1 &
else
  "$BIN/nvmegate-target" --dev-dir "$DEMO" --dev-identity target-stor-eu-1 --nvmet-root "$CFS" \
    > "$DEMO/target-agent.log" 2>&1 &
fi
agent=$!
trap 'kill "$gw" "$agent" 2>/dev/null' EXIT
for _ in $(seq 100); do grep -q "applied" "$DEMO/target-agent.log" 2>/dev/null && break; sleep 0.1; done
grep -q "applied" "$DEMO/target-agent.log" || fail "the target agent of stor-eu-1 did not start; see $DEMO/target-agent.log"
echo "   (stor-eu-1's target agent runs as its own process, pid $agent)"
for n in 1 2 3; do
  ok "acme-node-$n connects to acme's subsystem (config.json with its DH-HMAC-CHAP secrets, 0600)" -- \
    as acme-node-$n connect --job llm-pretrain-1 --subsystem "$ACME" --write-config "$DEMO/node$n-config.json"
  if command -v nvme >/dev/null 2>&1; then
    ok "nvme-cli reads node $n's config.json (its output, which shows the secret, is not printed)" -- \
      sh -c "nvme config -J '$DEMO/node$n-config.json' -O >/dev/null"
  fi
done
ok "the nvmet tree of stor-eu-1 allows exactly those three hosts" -- ls "$CFS/subsystems/$ACME/allowed_hosts"
refused "globex-node-1 cannot connect to acme's subsystem (tenant isolation)" PermissionDenied -- \
  as globex-node-1 connect --job llm-pretrain-1 --subsystem "$ACME"
refused "acme-node-1 cannot connect to a subsystem outside its job" PermissionDenied -- \
  as acme-node-1 connect --job llm-pretrain-1 --subsystem "$GLOBEX"
grant1=$(as admin -o json grants list --node spiffe://nvmegate.test/node/acme-gpu-1 --state active |
  sed -n 's/.*"grant_id": *"\([^"]*\)".*/\1/p' | head -1)
[ -n "$grant1" ] || fail "no active grant found for acme-node-1"
ok "the admin rotates acme's access root" -- as admin keys rotate --subsystem "$ACME" --reason "demo rotation"
ok "acme-node-1 renews: the new root's secret, already on the target" -- \
  as acme-node-1 renew "$grant1" --write-config "$DEMO/node1-config.json"
ok "acme-node-1 releases its grant: its host leaves the target" -- as acme-node-1 release "$grant1"
ok "two hosts left on stor-eu-1" -- ls "$CFS/subsystems/$ACME/allowed_hosts"
ok "acme's scheduler finishes the job: the remaining grants end, the root rotates" -- \
  as acme-scheduler job finish llm-pretrain-1 --reason "training done"
hosts_left=$(ls "$CFS/subsystems/$ACME/allowed_hosts" | wc -l | tr -d ' ')
[ "$hosts_left" = 0 ] || fail "hosts left on the target after the job finished: $hosts_left"
echo "      no host is allowed on stor-eu-1 any more"
ok "the admin lists the job's grants (released, revoked)" -- as admin grants list --job llm-pretrain-1

echo "== the node agent fails safe: a grant the kernel cannot use is released at once"
# nvmegate-node connects a job's subsystems through the kernel's NVMe host
# (/dev/nvme-fabrics), renews, re-keys live controllers and releases at the
# end; the VM tiers of make test run it on Linux 6.1 and 6.12. Here it is
# pointed at a fabrics device that does not exist, as on a machine without
# the NVMe host: it takes the grant, cannot connect, and releases it again.
ok "acme's scheduler admits job llm-agent-1 (acme-node-3, acme's dataset)" -- \
  as acme-scheduler job admit llm-agent-1 --tenant acme --node spiffe://nvmegate.test/node/acme-gpu-3 \
    --namespace "$ACME/1:ro" --region eu-west --expires-in 1h
if [ -n "$SPIFFE_SOCKET" ]; then
  node_id=(--spiffe-socket "$SPIFFE_SOCKET" --spiffe-id "${ID[acme-node-3]:?no SPIFFE ID for acme-node-3}" --addr "$ADDR")
else
  node_id=(--dev-dir "$DEMO" --dev-identity acme-node-3)
fi
"$BIN/nvmegate-node" run "${node_id[@]}" --job llm-agent-1 --keyring "" --status-socket "$DEMO/node-agent.sock" \
  --fabrics-dev "$DEMO/no-nvme-fabrics" --sysfs-class "$DEMO/no-sysfs" > "$DEMO/node-agent.log" 2>&1 &
node_agent=$!
for _ in $(seq 100); do
  "$BIN/nvmegate-node" status --status-socket "$DEMO/node-agent.sock" 2>/dev/null | grep -q 'no such file' && break
  sleep 0.1
done
ok "its status says why it is not connected, and holds no grant" -- \
  sh -c "'$BIN/nvmegate-node' status --status-socket '$DEMO/node-agent.sock' | tee /dev/stderr | grep -q 'nvme-fabrics: no such file'"
kill -TERM "$node_agent"; wait "$node_agent" || fail "the node agent exited with status $? on SIGTERM"
active=$(as admin grants list --job llm-agent-1 --state active | tail -n +2 | wc -l | tr -d ' ')
[ "$active" = 0 ] || fail "the node agent left $active active grant(s)"
ok "no grant of the job stays active, and no host on the target" -- as admin grants list --job llm-agent-1
[ -z "$(ls "$CFS/subsystems/$ACME/allowed_hosts")" ] || fail "a host is allowed on stor-eu-1 after the agent's failed connect"
ok "acme's scheduler finishes job llm-agent-1" -- as acme-scheduler job finish llm-agent-1 --reason "demo"

echo "== decisions stay true: the security team moves us-west data off us-west targets"
EVAL=nqn.2026-01.io.nvmegate.demo:acme-eval
DIGEST_E=sha256:$(printf 'acme/eval-2026' | sha256sum | cut -d' ' -f1)
ok "admin adds target stor-usw-1 (us-west, nvmet, programmed by the gateway itself)" -- \
  as admin inventory target add stor-usw-1 --fabric fab-usw --region us-west --driver nvmet \
    --port id=1,transport=tcp,family=ipv4,address=127.0.0.3,service=4420
ok "admin adds acme's eval subsystem on stor-usw-1" -- \
  as admin inventory subsystem add "$EVAL" --target stor-usw-1 --tenant acme --ports 1 --dhchap
ok "admin adds acme's eval dataset (us-west)" -- \
  as admin inventory namespace add "$EVAL" 1 --tenant acme --region us-west --class internal \
    --dataset acme/eval-2026 --digest "$DIGEST_E"
ok "acme's scheduler admits job llm-eval-1 (acme-node-2, the eval dataset, us-west)" -- \
  as acme-scheduler job admit llm-eval-1 --tenant acme --node spiffe://nvmegate.test/node/acme-gpu-2 \
    --namespace "$EVAL/1:ro" --region us-west --expires-in 12h
ok "acme-node-2 connects to the eval subsystem" -- as acme-node-2 connect --job llm-eval-1 --subsystem "$EVAL"
CAND="$DEMO/policy-candidate"
cp -r "$DEMO/policy" "$CAND"
sed -i 's/"us-west":    {"target_regions": \["us-west", "us-east"\]}/"us-west":    {"target_regions": ["us-east"]}/' "$CAND/data.json"
grep -q '"us-west":    {"target_regions": \["us-east"\]}' "$CAND/data.json" || fail "the candidate's residency edit did not apply"
ok "policy impact: the candidate (us-west data only on us-east targets) would revoke acme-node-2's grant, and says why" -- \
  as admin policy impact --candidate "$CAND"
refused "... so the security team's CI, with --fail-on-revoke, stops it" "would revoke 1" -- \
  as admin policy impact --candidate "$CAND" --fail-on-revoke
cp "$CAND/data.json" "$DEMO/policy/data.json" # loaded anyway: the site is being vacated
echo "   (the candidate is copied into the live policy directory; the gateway hot-reloads it)"
for _ in $(seq 100); do
  as admin grants list --job llm-eval-1 --state revoked 2>/dev/null | grep -q revoked && break
  sleep 0.2
done
ok "the reload re-decided the live grant: revoked, its entry naming the revision, the reasons and the change" -- \
  as auditor audit query --kind revoke --job llm-eval-1
usw_hosts=$(ls "$DEMO/state/configfs/stor-usw-1/subsystems/$EVAL/allowed_hosts" 2>/dev/null | wc -l | tr -d ' ')
[ "$usw_hosts" = 0 ] || fail "hosts left on stor-usw-1 after the revocation: $usw_hosts"
echo "      stor-usw-1 allows no host any more"
refused "acme-node-2 connects again: refused by the new revision (residency)" PermissionDenied -- \
  as acme-node-2 connect --job llm-eval-1 --subsystem "$EVAL"
as auditor attest compliance > "$DEMO/compliance.json" 2>/dev/null || fail "attest compliance"
echo "   (the auditor has the gateway sign a compliance attestation: $DEMO/compliance.json)"

echo "== the security admin dry-runs job admissions against the live policy (Policy.Explain)"
IN=scripts/demo-inputs
decides "acme's scheduler admits a job reading acme's dataset in eu-west" ALLOW -- \
  as admin policy explain --input "$IN/admit-ok.json"
decides "... but not with a namespace of another tenant (tenant isolation)" DENY -- \
  as admin policy explain --input "$IN/admit-other-tenant.json"
decides "... nor when the job may only read in us-east (residency)" DENY -- \
  as admin policy explain --input "$IN/admit-residency.json"
decides "... nor write to an immutable dataset (data class obligation)" DENY -- \
  as admin policy explain --input "$IN/admit-immutable-rw.json"
decides "the same decision offline, from the policy sources (policy eval)" ALLOW -- \
  "$BIN/nvmegate" policy eval --policy policy --input "$IN/admit-ok.json"

echo "== the NVMe key formats nvmegate emits (offline, no gateway involved)"
dh=$("$BIN/nvmegate" keys gen dhchap --hash sha384) || fail "keys gen dhchap"
ok "a generated DH-HMAC-CHAP secret parses back (kind, hash, length; never the secret)" -- "$BIN/nvmegate" keys parse "$dh"
ok "a TLS PSK in the interchange format, with its PSK identities (libnvme's test vector)" -- \
  "$BIN/nvmegate" keys format tls-psk --hash sha256 \
    --secret 5512DBB6737D0106F65975B773DFB011FFC344BCF442E2DD6D8BC4870B5D5B03 \
    --hostnqn nqn.psk-test-host --subnqn nqn.psk-test-subsys
refused "a DHHC-1 string with a broken CRC is refused, naming the part" "CRC" -- \
  "$BIN/nvmegate" keys parse "DHHC-1:00:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA:"
if command -v nvme >/dev/null 2>&1; then
  ok "nvme-cli accepts the generated secret" -- nvme check-dhchap-key -k "$dh"
else
  echo "   (nvme-cli not installed: skipping its check of the generated secret)"
fi

echo "== keys: per-subsystem access roots and per-namespace data keys (local sealed store; never shown)"
ok "the admin rotates acme's access root (created on first use)" -- as admin keys rotate --subsystem "$ACME" --reason "demo"
ok "... and again: the previous root stays valid for the grace period" -- as admin keys rotate --subsystem "$ACME" --reason "demo, again"
ok "the admin rotates the data key of acme's namespace 1 (KEK rotated, data key rewrapped)" -- \
  as admin keys rotate --subsystem "$ACME" --nsid 1 --reason "demo"
ok "key status: versions, ages, grace, next rotation and fingerprints" -- as admin keys status
refused "a scheduler may not rotate keys" PermissionDenied -- as acme-scheduler keys rotate --subsystem "$ACME"

echo "== the audit log: every change and every refusal above, signed and verifiable offline"
ok "the auditor lists the refusals recorded so far" -- as auditor audit query --kind deny --page-size 5
ok "the auditor saves the current signed checkpoint" -- as auditor audit checkpoint --out "$DEMO/checkpoint-1"
refused "acme's scheduler may not read the audit log" PermissionDenied -- as acme-scheduler audit query
ok "the admin adds one more host binding (recorded before it is made)" -- \
  as admin inventory host add spiffe://nvmegate.test/node/acme-gpu-9 --tenant acme \
    --nqn nqn.2014-08.org.nvmexpress:uuid:00000009-aaaa-4000-8000-000000000000
ok "the auditor exports the log (C2SP tlog-tiles + public keys)" -- as auditor audit export --out "$DEMO/audit-export"
key="$DEMO/audit-export/keys/v1.pem"
ok "an inclusion proof of the first entry, checked against the signed checkpoint" -- \
  as auditor audit proof inclusion --index 0 --key "$key"
ok "offline: the export verifies with the public key alone, extending the saved checkpoint" -- \
  "$BIN/nvmegate" audit verify "$DEMO/audit-export" --key "$key" --since "$DEMO/checkpoint-1"
cp -r "$DEMO/audit-export" "$DEMO/audit-tampered"
perl -0pi -e 's/add_target/add_TARGET/' "$DEMO/audit-tampered/tile/entries/000.p/"* 2>/dev/null ||
  perl -0pi -e 's/add_target/add_TARGET/' "$DEMO/audit-tampered/tile/entries/"*
refused "offline: a copy with one entry edited is refused, naming the entry" modified_entry -- \
  "$BIN/nvmegate" audit verify "$DEMO/audit-tampered" --key "$key"
as auditor attest lineage --job llm-pretrain-1 > "$DEMO/lineage-llm-pretrain-1.json" || fail "attest lineage"
ok "the auditor verifies the job's signed lineage offline (datasets, every entry proved in the log)" -- \
  "$BIN/nvmegate" attest verify "$DEMO/lineage-llm-pretrain-1.json" --key "$key"

ok "the auditor verifies the compliance attestation offline: signed, anchored, recorded in the log; it names the eval dataset outside its geo-fence" -- \
  sh -c "'$BIN/nvmegate' attest verify '$DEMO/compliance.json' --key '$key' | tee /dev/stderr | grep -q 'may not be served from target stor-usw-1'"

ok "the auditor's report of job llm-eval-1 (one HTML page: the log verified, then the grant and its revocation on a timeline)" -- \
  as auditor audit report --job llm-eval-1 --export "$DEMO/audit-export" --key "$key" --html "$DEMO/report-llm-eval-1.html"
grep -q 'class="grant revoke"' "$DEMO/report-llm-eval-1.html" || fail "the report does not show the revoked grant"
grep -q '<ul id="attestations"><li>index' "$DEMO/report-llm-eval-1.html" || fail "the report does not list the compliance attestation made after the change"

# Count what the gateway holds, from its own listings (header line excluded).
count() { as admin inventory "$1" list --page-size 1000 | tail -n +2 | wc -l | tr -d ' '; }
counts="$(count target) targets, $(count subsystem) subsystems, $(count namespace) namespaces, $(count host) host bindings"

echo "== stopping the gateway (SIGTERM)"
kill -TERM "$agent" 2>/dev/null; wait "$agent" 2>/dev/null
kill -TERM "$gw"
wait "$gw"; rc=$?
trap - EXIT
[ "$rc" -eq 0 ] || fail "the gateway exited with status $rc on SIGTERM"
ok "offline: the gateway's log file verifies, its shutdown checkpoint covering every entry" -- \
  "$BIN/nvmegate" audit verify --db "$DEMO/state/audit.db" --key "$key"

echo
echo "Demo passed: $steps steps ($ok_steps succeeded or decided as expected, $refused_steps refused as expected)."
echo "  inventory: $counts"
echo "  state, SVIDs and the gateway log are in $DEMO/"
echo "  the auditor's report: $DEMO/report-llm-eval-1.html"
