# Helpers shared by the VM tiers' stories (story.sh: Linux 6.1; story-6.12.sh),
# sourced by them from /lib.sh. See story.sh for the step protocol.
# Secrets pass between steps in files under /tmp and are never printed.
G=/tmp/gw
CFS=/sys/kernel/config/nvmet
ACME=nqn.2026-01.io.nvmegate.vm:acme-train
GLOBEX=nqn.2026-01.io.nvmegate.vm:globex-ckpt
DIGEST=sha256:$(printf 'vm-dataset' | sha256sum | cut -d' ' -f1)

as() { local who=$1; shift; nvmegate --dev-dir "$G" --dev-identity "$who" "$@"; }

# step NAME CMD...: run CMD as one recorded step.
step() {
  local name=$1; shift
  dmesg -c >/dev/null
  echo "@@BEGIN $name"
  "$@" 2>&1
  local rc=$?
  echo "@@EXIT $rc"
  sleep 0.2 # let the kernel finish logging what the step started
  echo "@@KERNEL"
  dmesg -c
  echo "@@END $name"
}

# nvme_connect NAME: nvme connect with the arguments a grant printed (the
# secrets stay in the file), then wait for the namespace's block device and
# read its first block through the fabric.
nvme_connect() {
  eval "set -- $(sed -n 's/^nvme connect //p' "/tmp/$1.args")"
  [ $# -gt 0 ] || { echo "no nvme connect line in the grant's output"; return 2; }
  nvme connect "$@" $NVME_CONNECT_EXTRA >/dev/null || return $?
  for _ in $(seq 300); do
    dev=$(ls /sys/block 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
    [ -n "$dev" ] && [ -b "/dev/$dev" ] && break
    sleep 0.1
  done
  [ -n "$dev" ] || { echo "connected, but no namespace block device appeared"; return 3; }
  echo "block device /dev/$dev"
  dd if="/dev/$dev" of=/dev/null bs=4096 count=1 2>&1 | tail -1
}

# disconnect: drop every NVMe-oF controller of this host.
disconnect() { nvme disconnect-all >/dev/null 2>&1; sleep 0.2; ls /sys/block | grep '^nvme' || echo "no nvme block devices"; }

# grant NODE ARGS...: run a node's connect/renew with --print-connect into
# /tmp/NAME.args (secrets), echoing the grant's table without the secrets.
grant() {
  local name=$1 who=$2; shift 2
  as "$who" "$@" --print-connect > "/tmp/$name.args" || { cat "/tmp/$name.args"; return 1; }
  grep -v '^nvme connect' "/tmp/$name.args"
  grep -q '^nvme connect .*--dhchap-secret=DHHC-1:' "/tmp/$name.args" && echo "(nvme connect line with a DH-HMAC-CHAP secret received)"
}
grant_id() { sed -n 's/^\(g-[A-Za-z0-9_-]*\) .*/\1/p' "/tmp/$1.args" | head -1; }

# A short grace for superseded access roots and a fast reconcile, so that
# the story sees a rotation's grace end (the defaults are 1h and 30s).
start_gateway() {
  printf 'keys:\n  grace: 15s\ntargets:\n  reconcile_interval: 500ms\n' > /tmp/nvmegated.yaml
  cp -r /policy /tmp/policy
  nvmegated dev --config /tmp/nvmegated.yaml --dir "$G" --listen 127.0.0.1:0 --http-listen 127.0.0.1:0 --remote-targets stor-eu-1 \
    --policy-dir /tmp/policy --policy-reload-interval 500ms 2>/tmp/gateway.log &
  for _ in $(seq 300); do [ -f "$G/gateway.json" ] && { cat "$G/gateway.json"; return 0; }; sleep 0.1; done
  tail -20 /tmp/gateway.log; return 1
}

# The storage operator's part: the namespaces and their backing devices
# (null_blk), which nvmegate does not manage.
operator_namespaces() {
  for pair in "$ACME:nullb0" "$GLOBEX:nullb1"; do
    nqn=${pair%:*} dev=${pair##*:}
    mkdir -p "$CFS/subsystems/$nqn/namespaces/1" || return 1
    echo "/dev/$dev" > "$CFS/subsystems/$nqn/namespaces/1/device_path" || return 1
    echo 1 > "$CFS/subsystems/$nqn/namespaces/1/enable" || return 1
  done
  ls "$CFS/subsystems"
}

# wait_host_gone NQN: wait (up to 2 min) until the target no longer has the host.
wait_host_gone() {
  for _ in $(seq 1200); do
    [ -d "$CFS/hosts/$1" ] || { echo "host $1 removed from the target"; return 0; }
    sleep 0.1
  done
  echo "host $1 still on the target"; return 1
}

# tighten_policy: eu-west data only over fabric f1; wait (up to 30 s) for
# the reload to revoke globex's grant.
tighten_policy() {
  sed -i 's/"eu-west":    {"target_regions": \["eu-west", "eu-central"\]}/"eu-west":    {"target_regions": ["eu-west", "eu-central"], "fabrics": ["f1"]}/' /tmp/policy/data.json
  grep -q '"fabrics": \["f1"\]' /tmp/policy/data.json || { echo "the policy edit did not apply"; return 1; }
  for _ in $(seq 300); do
    as admin grants list --job vm-ckpt-1 --state revoked 2>/dev/null | grep -q revoked && {
      echo "globex's grant revoked by the reload"; grep -o 'grant revoked: no longer allowed[^"]*' /tmp/gateway.log | head -1; return 0; }
    sleep 0.1
  done
  echo "globex's grant not revoked"; tail -5 /tmp/gateway.log; return 1
}

start_agent() {
  # No udev in the VM: device-mapper makes its own /dev/mapper nodes.
  DM_DISABLE_UDEV=1 nvmegate-target --dev-dir "$G" --dev-identity target-stor-eu-1 --nvmet-root "$CFS" >/tmp/agent.log 2>&1 &
  for _ in $(seq 300); do grep -q applied /tmp/agent.log && { grep applied /tmp/agent.log | head -1; return 0; }; sleep 0.1; done
  cat /tmp/agent.log; return 1
}

# tree: what the agent wrote in the nvmet configfs tree, in the golden trees'
# notation, secrets replaced by their length.
tree() (
  cd "$CFS" || exit 1
  for h in hosts/*; do
    [ -d "$h" ] || continue
    echo "d $h"
    for a in dhchap_ctrl_key dhchap_key; do
      v=$(cat "$h/$a")
      [ -n "$v" ] && echo "f $h/$a <${#v}-byte secret, sha256 $(printf %s "$v" | sha256sum | cut -c1-12)>" || echo "f $h/$a <none>"
    done
    for a in dhchap_dhgroup dhchap_hash; do echo "f $h/$a $(cat "$h/$a")"; done
  done
  for p in ports/*; do
    for a in adrfam traddr treq trsvcid trtype; do echo "f $p/addr_$a $(cat "$p/addr_$a")"; done
    for l in "$p"/subsystems/*; do [ -L "$l" ] && echo "l $l -> $(readlink "$l")"; done
  done
  for s in subsystems/*; do
    echo "f $s/attr_allow_any_host $(cat "$s/attr_allow_any_host")"
    for l in "$s"/allowed_hosts/*; do [ -L "$l" ] && echo "l $l -> $(readlink "$l")"; done
  done
  true
)

# rekey_live NAME WHO: with NAME's grant connected and a read loop running
# over the fabric, the subsystem's root rotates, WHO renews (the target's host
# entry gets the new key at once) and the new DH-HMAC-CHAP secret is
# written to the live controller's sysfs attribute: the kernel
# re-authenticates it in place. The loop reads a new block each time (no
# page cache) and counts errors.
rekey_live() {
  local dev ctrl new
  dev=/dev/$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
  ctrl=$(ls /sys/class/nvme | head -1)
  rm -f /tmp/stop-reads /tmp/reads
  ( n=0; e=0; while [ ! -f /tmp/stop-reads ]; do
      dd if="$dev" of=/dev/null bs=4096 count=1 skip=$((n + e)) 2>/dev/null && n=$((n+1)) || e=$((e+1)); sleep 0.05
    done; echo "reads $n errors $e" > /tmp/reads ) &
  sleep 1
  as admin keys rotate --subsystem "$ACME" --reason "live re-key" >/dev/null || return 1
  grant "$1-renewed" "$2" renew "$(grant_id "$1")" >/dev/null || return 1
  new=$(grep -o -- "--dhchap-secret=[^ ']*" "/tmp/$1-renewed.args" | cut -d= -f2-)
  [ -n "$new" ] || { echo "no new secret in the renewal"; return 1; }
  printf %s "$new" > "/sys/class/nvme/$ctrl/dhchap_secret" || return 1
  sleep 2
  touch /tmp/stop-reads; sleep 0.5
  cat /tmp/reads
  echo "controller $ctrl state $(cat "/sys/class/nvme/$ctrl/state")"
}

# The node agent (nvmegate-node): it connects a job's subsystems through
# /dev/nvme-fabrics itself, renews every 2 s, and serves its status on
# /tmp/node.sock.
NODE_SOCK=/tmp/node.sock
node_status() { nvmegate-node status --status-socket "$NODE_SOCK" "$@"; }
node_json() { node_status -o json | sed -n "s/^ *\"$1\": \"*\([^\",]*\)\"*,*$/\1/p" | head -1; }

# start_node_agent JOB WHO [ARGS]: run the agent as WHO for JOB, and wait
# (up to 60 s) until its status shows a live controller.
start_node_agent() {
  local job=$1 who=$2; shift 2
  nvmegate-node run --dev-dir "$G" --dev-identity "$who" --job "$job" --renew-every 2s --status-socket "$NODE_SOCK" "$@" >/tmp/node.log 2>&1 &
  NODE_PID=$!
  for _ in $(seq 600); do
    [ "$(node_json state 2>/dev/null)" = live ] && { node_status; return 0; }
    kill -0 "$NODE_PID" 2>/dev/null || break
    sleep 0.1
  done
  node_status; cat /tmp/node.log; return 1
}

# agent_rekey: with the agent's controller live and a read loop running
# over the fabric, the subsystem SUB's root rotates; the agent's next
# renewal gets the new secrets and hands them to the live controller. Wait
# for that and two more renewals, then report the reads. The secret the
# controller held before is kept (never shown) for agent_old_secret.
agent_rekey() {
  local sub=$1 ctrl dev n
  ctrl=$(node_json controller)
  dev=/dev/$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
  cat "/sys/class/nvme/$ctrl/dhchap_secret" > /tmp/agent-old-secret
  cat "/sys/class/nvme/$ctrl/dhchap_ctrl_secret" > /tmp/agent-old-ctrl-secret
  rm -f /tmp/stop-reads /tmp/reads
  ( n=0; e=0; while [ ! -f /tmp/stop-reads ]; do
      dd if="$dev" of=/dev/null bs=4096 count=1 skip=$((n + e)) 2>/dev/null && n=$((n+1)) || e=$((e+1)); sleep 0.05
    done; echo "reads $n errors $e" > /tmp/reads ) &
  sleep 1
  as admin keys rotate --subsystem "$sub" --reason "agent live re-key" >/dev/null || return 1
  for _ in $(seq 300); do [ "$(node_json rekeys)" = 1 ] && break; sleep 0.1; done
  [ "$(node_json rekeys)" = 1 ] || { echo "the agent did not re-key"; node_status; tail -5 /tmp/node.log; return 1; }
  sleep 5 # two more renewals, nothing new
  touch /tmp/stop-reads; sleep 0.5
  cat /tmp/reads
  node_status
  grep -o 'msg="re-keyed the live controller".*' /tmp/node.log | head -1
  now=$(node_json controller)
  [ "$now" = "$ctrl" ] || echo "controller $ctrl replaced by $now (gone: $([ -e "/sys/class/nvme/$ctrl" ] && echo no || echo yes))"
  ctrl=$now
  echo "controller $ctrl state $(cat "/sys/class/nvme/$ctrl/state"), re-keys $(node_json rekeys)"
  echo "block device $dev: $([ -b "$dev" ] && echo there || echo gone)"
  cmp -s /tmp/agent-old-secret "/sys/class/nvme/$ctrl/dhchap_secret" && { echo "the controller still holds the old secret"; return 1; }
  echo "the controller holds the new secret"
  grep -q '^DHHC-1' /tmp/agent-old-ctrl-secret || return 0
  cmp -s /tmp/agent-old-ctrl-secret "/sys/class/nvme/$ctrl/dhchap_ctrl_secret" && { echo "the controller still holds the old controller secret"; return 1; }
  echo "the controller holds the new controller secret"
}

# agent_old_secret SUB [OPTIONS]: a second controller to SUB (a duplicate
# connect, through /dev/nvme-fabrics as the agent connects) with the
# DH-HMAC-CHAP secret the agent's controller held before the rotation;
# OPTIONS are more fabrics options (",tls,keyring=N").
agent_old_secret() {
  local sub=$1 ctrl rc; ctrl=$(node_json controller)
  printf '%s' "nqn=$sub,transport=tcp,traddr=127.0.0.1,trsvcid=4420,hostnqn=$(cat "/sys/class/nvme/$ctrl/hostnqn"),hostid=$(cat "/sys/class/nvme/$ctrl/hostid"),dhchap_secret=$(cat /tmp/agent-old-secret),duplicate_connect$2" \
    > /dev/nvme-fabrics 2>/tmp/old.err
  rc=$?
  sed 's/^.*: //' /tmp/old.err
  sleep 0.3
  echo "controllers: $(ls /sys/class/nvme | tr '\n' ' ')"
  return $rc
}

# agent_stop SUB HOSTNQN: SIGTERM; the agent deletes its controller,
# removes its PSKs and releases its grant: no controller, no host left.
agent_stop() {
  local sub=$1 host=$2
  kill -TERM "$NODE_PID"; wait "$NODE_PID"; echo "agent exit $?"
  grep -E 'msg=released' /tmp/node.log | sed 's/^time=[^ ]* //'
  echo "controllers: $(ls /sys/class/nvme | tr '\n' ' ')"
  [ -e "$CFS/subsystems/$sub/allowed_hosts/$host" ] && echo "host $host still allowed" || echo "host $host not allowed on $sub"
  [ -d "$CFS/hosts/$host" ] && echo "host entry $host still there" || echo "no host entry $host"
  [ -e "$NODE_SOCK" ] && echo "status socket left behind" || true
}

# agent_restart JOB WHO [ARGS]: with a read loop running, the agent dies
# (SIGKILL: no release, no clean-up) and starts again; the new agent takes
# over the live controller with a new grant's secrets.
agent_restart() {
  local ctrl dev
  ctrl=$(node_json controller)
  dev=/dev/$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
  rm -f /tmp/stop-reads /tmp/reads
  ( n=0; e=0; while [ ! -f /tmp/stop-reads ]; do
      dd if="$dev" of=/dev/null bs=4096 count=1 skip=$((n + e)) 2>/dev/null && n=$((n+1)) || e=$((e+1)); sleep 0.05
    done; echo "reads $n errors $e" > /tmp/reads ) &
  sleep 1
  kill -KILL "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
  echo "agent killed; controllers: $(ls /sys/class/nvme | tr '\n' ' ')"
  mv /tmp/node.log /tmp/node-1.log
  start_node_agent "$@" >/dev/null || { cat /tmp/node.log; return 1; }
  sleep 3
  touch /tmp/stop-reads; sleep 0.5
  cat /tmp/reads
  grep -o 'msg="took over a live controller".*' /tmp/node.log | head -1
  echo "controller before $ctrl, now $(node_json controller), state $(node_json state); block device $dev: $([ -b "$dev" ] && echo there || echo gone)"
  cat /tmp/node-1.log >> /tmp/node.log
}

# uptime_cs: the uptime in centiseconds (busybox has no date +%N).
uptime_cs() { local u _; read -r u _ < /proc/uptime; echo "${u%.*}${u#*.}"; }
