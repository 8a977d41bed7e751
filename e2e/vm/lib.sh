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
  DM_DISABLE_UDEV=1 nvmegate-target --dev-dir "$G" --dev-identity target-stor-eu-1 --nvmet-root "$CFS" --reencrypt-dir /tmp/reencrypt >/tmp/agent.log 2>&1 &
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

# start_reads DEV: a read loop over the fabric, a new block each time (no
# page cache), counting reads and errors until stop_reads prints them.
start_reads() {
  rm -f /tmp/stop-reads /tmp/reads
  ( n=0; e=0; while [ ! -f /tmp/stop-reads ]; do
      dd if="$1" of=/dev/null bs=4096 count=1 skip=$((n + e)) 2>/dev/null && n=$((n+1)) || e=$((e+1)); sleep 0.05
    done; echo "reads $n errors $e" > /tmp/reads ) &
  sleep 1
}
stop_reads() {
  touch /tmp/stop-reads
  for _ in $(seq 300); do [ -f /tmp/reads ] && break; sleep 0.1; done # a read may hang on a reconnect
  cat /tmp/reads
}

# rekey_live NAME WHO: with NAME's grant connected and a read loop running
# over the fabric, the subsystem's root rotates, WHO renews (the target's host
# entry gets the new key at once) and the new DH-HMAC-CHAP secret is
# written to the live controller's sysfs attribute: the kernel
# re-authenticates it in place; the read loop (start_reads) counts errors.
rekey_live() {
  local dev ctrl new
  dev=/dev/$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
  ctrl=$(ls /sys/class/nvme | head -1)
  start_reads "$dev"
  as admin keys rotate --subsystem "$ACME" --reason "live re-key" >/dev/null || return 1
  grant "$1-renewed" "$2" renew "$(grant_id "$1")" >/dev/null || return 1
  new=$(grep -o -- "--dhchap-secret=[^ ']*" "/tmp/$1-renewed.args" | cut -d= -f2-)
  [ -n "$new" ] || { echo "no new secret in the renewal"; return 1; }
  printf %s "$new" > "/sys/class/nvme/$ctrl/dhchap_secret" || return 1
  sleep 2
  stop_reads
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
  start_reads "$dev"
  as admin keys rotate --subsystem "$sub" --reason "agent live re-key" >/dev/null || return 1
  for _ in $(seq 300); do [ "$(node_json rekeys)" = 1 ] && break; sleep 0.1; done
  [ "$(node_json rekeys)" = 1 ] || { echo "the agent did not re-key"; node_status; tail -5 /tmp/node.log; return 1; }
  sleep 5 # two more renewals, nothing new
  stop_reads
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
  local sub=$1 ctrl rc opts; ctrl=$(node_json controller)
  opts="nqn=$sub,transport=tcp,traddr=127.0.0.1,trsvcid=4420,hostnqn=$(cat "/sys/class/nvme/$ctrl/hostnqn"),hostid=$(cat "/sys/class/nvme/$ctrl/hostid"),dhchap_secret=$(cat /tmp/agent-old-secret),duplicate_connect$2"
  # In a subshell that ignores SIGPIPE: when the target ends the
  # connection mid-authentication, nvme-tcp's send on the closed socket
  # (in the writer's context) raises SIGPIPE, which killed the story
  # itself once (CI, 6.12 under emulation); ignored, the write fails
  # with EPIPE, a refusal like any other.
  (trap '' PIPE; printf '%s' "$opts" > /dev/nvme-fabrics) 2>/tmp/old.err
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

# Slurm's node hooks, run as slurmd runs them: through their links (beside
# the hooks' configuration), with no arguments and a bare environment of
# the job's variables. slurmd itself is not in this VM (its busybox
# userland has no Slurm); e2e/slurm_test.go runs a real Slurm for the
# controller's hooks.
SLURM_HOOKS=/tmp/slurm-hooks
slurm_hooks_install() {
  mkdir -p "$SLURM_HOOKS" || return 1
  for h in nvmegate-node-prolog nvmegate-node-task-prolog nvmegate-node-epilog; do
    ln -sf "$(command -v nvmegate-node)" "$SLURM_HOOKS/$h" || return 1
  done
  printf 'dev-dir = %s\ndev-identity = %s\nrenew-every = 2s\nrun-dir = /tmp/slurm-jobs\nconnect-timeout = 60s\n%s\n' \
    "$G" "$1" "$2" > "$SLURM_HOOKS/nvmegate-node-slurm.conf"
  cat "$SLURM_HOOKS/nvmegate-node-slurm.conf"
}
# slurm_hook HOOK JOB DATASET: run a node hook for JOB, which asks for DATASET.
slurm_hook() {
  env -i SLURM_JOB_ID="$2" SLURM_JOB_USER=alice SLURM_JOB_UID=4242 SLURM_JOB_NODELIST=acme-gpu-1 SLURM_JOB_RESTART_COUNT=0 \
    SLURM_JOB_COMMENT="train nvmegate:$3" "$SLURM_HOOKS/$1"
}
# slurm_task JOB DATASET: the job's task — the TaskProlog's export line in
# its environment (as slurmd puts it there), then a read of its dataset
# through the device the line names.
slurm_task() {
  local line dev
  line=$(slurm_hook nvmegate-node-task-prolog "$1" "$2") || return 1
  echo "task prolog: $line"
  eval "$line"
  dev=${NVMEGATE_DEVICES%%,*}
  [ -b "$dev" ] || { echo "no block device $dev"; return 1; }
  # slurmd runs the task as the job's user: the device and the list are its.
  echo "$dev owner $(stat -c %u "$dev"); devices file owner $(stat -c %u /tmp/slurm-jobs/$1.devices) mode $(stat -c %a /tmp/slurm-jobs/$1.devices)"
  echo "the job read $(dd if="$dev" bs=4096 count=16 2>/dev/null | wc -c) bytes of its dataset from $dev"
}
# slurm_epilog JOB DATASET SUB HOST: the Epilog, then what it left.
slurm_epilog() {
  slurm_hook nvmegate-node-epilog "$1" "$2" || return 1
  echo "controllers: $(ls /sys/class/nvme | tr '\n' ' ')"
  [ -e "$CFS/subsystems/$3/allowed_hosts/$4" ] && echo "host $4 still allowed" || echo "host $4 not allowed on $3"
  [ -e "/tmp/slurm-jobs/$1" ] && echo "job state left behind" || echo "no job state left"
}

# agent_restart JOB WHO [ARGS]: with a read loop running, the agent dies
# (SIGKILL: no release, no clean-up) and starts again; the new agent takes
# over the live controller with a new grant's secrets.
agent_restart() {
  local ctrl dev
  ctrl=$(node_json controller)
  dev=/dev/$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1)
  start_reads "$dev"
  kill -KILL "$NODE_PID"; wait "$NODE_PID" 2>/dev/null
  echo "agent killed; controllers: $(ls /sys/class/nvme | tr '\n' ' ')"
  mv /tmp/node.log /tmp/node-1.log
  start_node_agent "$@" >/dev/null || { cat /tmp/node.log; return 1; }
  sleep 3
  stop_reads
  grep -o 'msg="took over a live controller".*' /tmp/node.log | head -1
  echo "controller before $ctrl, now $(node_json controller), state $(node_json state); block device $dev: $([ -b "$dev" ] && echo there || echo gone)"
  cat /tmp/node-1.log >> /tmp/node.log
}

# uptime_cs: the uptime in centiseconds (busybox has no date +%N).
uptime_cs() { local u _; read -r u _ < /proc/uptime; echo "${u%.*}${u#*.}"; }

AT_REST_NODE=spiffe://nvmegate.test/node/acme-gpu-1
AT_REST_AGENT="" # more nvmegate-node flags (6.12: its TLS keyring)
# Encryption at rest (both tiers; at_rest_story): acme's subsystem ENC has two namespaces on loop
# devices (files in RAM), registered with --backing-device: the target
# agent opens each through dm-crypt (AES-XTS) with the namespace's data key,
# received over its stream, and nvmet exports the mapping. A node writes a
# known pattern over the fabric; the raw device holds no trace of it, the
# other namespace's key reads nothing of it, and after the target agent
# restarts (its mappings closed, as after a reboot) the data is back.
ENC=nqn.2026-01.io.nvmegate.vm:acme-enc
export DM_DISABLE_UDEV=1 # no udev in the VM: device-mapper makes its own nodes
PATTERN=NVMEGATE-AT-REST-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
at_rest_disks() {
  mkdir -p /run/cryptsetup
  for i in 0 1; do
    dd if=/dev/zero of="/tmp/disk$i.img" bs=1M count=32 2>/dev/null && losetup "/dev/loop$i" "/tmp/disk$i.img" || return 1
  done
  losetup -a
}
mapping_of() { sed -n 's|^/dev/mapper/||p' "$CFS/subsystems/$ENC/namespaces/$1/device_path"; }
at_rest_mapped() {
  for _ in $(seq 300); do
    [ "$(cat "$CFS/subsystems/$ENC/namespaces/1/enable" 2>/dev/null)$(cat "$CFS/subsystems/$ENC/namespaces/2/enable" 2>/dev/null)" = 11 ] && break
    sleep 0.1
  done
  for n in 1 2; do
    m=$(mapping_of $n)
    echo "namespace $n: device_path /dev/mapper/$m, enable $(cat "$CFS/subsystems/$ENC/namespaces/$n/enable")"
    cryptsetup status "$m" | grep -E 'type|cipher|keysize|device:' | sed 's/^ */  /'
  done
  [ -n "$(mapping_of 2)" ] || { ls -l /dev/mapper; grep -iE 'error|warn' /tmp/agent.log | tail -5; return 1; }
}
# ns_dev NSID: the node's block device of namespace NSID of ENC.
ns_dev() {
  for _ in $(seq 100); do
    for b in /sys/block/nvme*n*; do
      [ "$(cat "$b/device/subsysnqn" 2>/dev/null)" = "$ENC" ] && [ "$(cat "$b/nsid" 2>/dev/null)" = "$1" ] && [ -b "/dev/${b##*/}" ] &&
        { echo "/dev/${b##*/}"; return 0; }
    done
    sleep 0.1
  done
  return 1
}
# at_rest_write: the pattern over the fabric into namespace 1 (1 MiB),
# read back over the fabric.
at_rest_write() {
  local dev; dev=$(ns_dev 1) || { echo "no block device for namespace 1"; ls /sys/block; return 1; }
  yes "$PATTERN" | head -c 1048576 > /tmp/pattern.bin
  dd if=/tmp/pattern.bin of="$dev" bs=4096 conv=fsync 2>&1 | tail -1
  echo 3 > /proc/sys/vm/drop_caches
  dd if="$dev" of=/tmp/readback.bin bs=4096 count=256 2>/dev/null
  cmp /tmp/pattern.bin /tmp/readback.bin && echo "read back over the fabric from $dev: the pattern ($(strings /tmp/readback.bin | grep -c "$PATTERN") lines)"
}
# count WHERE: lines of the pattern in a device or file.
count() { echo 3 > /proc/sys/vm/drop_caches; strings "$1" | grep -c "$PATTERN"; }
at_rest_raw() {
  echo "pattern lines in the mapping /dev/mapper/$(mapping_of 1): $(count "/dev/mapper/$(mapping_of 1)")"
  echo "pattern lines on the raw device /dev/loop0: $(count /dev/loop0)"
  echo "pattern lines in its backing file: $(count /tmp/disk0.img)"
}
# at_rest_other_key: namespace 1's device read through a mapping made with
# namespace 2's key (taken from the kernel's table, never shown).
at_rest_other_key() {
  local sectors
  sectors=$(($(stat -c %s /tmp/disk0.img) / 512))
  dmsetup table --showkeys "$(mapping_of 2)" | awk -v s="$sectors" '{print 0, s, $3, $4, $5, $6, "/dev/loop0", $8}' | dmsetup create other-key || return 1
  echo "pattern lines in namespace 1's device read with namespace 2's key: $(count /dev/mapper/other-key)"
  dmsetup remove other-key
}
# at_rest_restart: the node agent stops, the target agent stops and its
# mappings close (as after a reboot); both start again; the data is back.
at_rest_restart() {
  kill -TERM "$NODE_PID"; wait "$NODE_PID"
  kill -TERM "$(pidof nvmegate-target)"; sleep 0.5
  for n in 1 2; do echo 0 > "$CFS/subsystems/$ENC/namespaces/$n/enable"; cryptsetup close "$(mapping_of $n)" || return 1; done
  echo "mappings open after the stop: $(ls /dev/mapper | grep -c nvmegate-)"
  mv /tmp/agent.log /tmp/agent-1.log
  start_agent >/dev/null || return 1
  cat /tmp/agent-1.log >> /tmp/agent.log
  at_rest_mapped | grep enable
  start_node_agent vm-enc-1 acme-node-1 $AT_REST_AGENT >/dev/null || return 1
  local dev; dev=$(ns_dev 1) || return 1
  echo 3 > /proc/sys/vm/drop_caches
  dd if="$dev" of=/tmp/readback2.bin bs=4096 count=256 2>/dev/null
  cmp /tmp/pattern.bin /tmp/readback2.bin && echo "after the restart, namespace 1 reads the same data over the fabric"
}
# at_rest_reencrypt: namespace 1's data key rotated by re-encryption (its
# subsystem has no active grant now). The target agent takes it offline,
# re-encrypts /dev/loop0 to the new key and reports; the gateway destroys
# the old key and the namespace comes back. The data reads the same
# through the new mapping; the old key (kept here from the kernel's table
# before) reads none of it; the raw device shows none.
at_rest_reencrypt() {
  local m before after i
  m=$(mapping_of 1)
  dmsetup table --showkeys "$m" > /tmp/old-table || return 1
  before=$(head -c 1048576 /dev/loop0 | sha256sum | cut -c1-16)
  as admin keys rotate --subsystem "$ENC" --nsid 1 --reencrypt --reason "vm data-key rotation" | grep -o 'REENCRYPTING to gen [0-9]*' | head -1
  for i in $(seq 600); do
    as admin keys status --subsystem "$ENC" --kind data-key 2>/dev/null | grep "$ENC/1 gen 2" | grep -q -v REENCRYPTING &&
      [ "$(cat "$CFS/subsystems/$ENC/namespaces/1/enable" 2>/dev/null)" = 1 ] && break
    sleep 0.1
  done
  as admin keys status --subsystem "$ENC" --kind data-key | grep "$ENC/1" | sed 's/  */ /g; s/^/key status: /'
  grep -E 'msg=re-encrypted' /tmp/agent.log | sed 's/^time=[^ ]* //' | head -1
  echo "namespace 1 enable $(cat "$CFS/subsystems/$ENC/namespaces/1/enable" 2>/dev/null) after ${i}00 ms"
  after=$(head -c 1048576 /dev/loop0 | sha256sum | cut -c1-16)
  [ "$before" != "$after" ] && echo "the ciphertext on /dev/loop0 changed"
  echo "pattern lines through the new mapping: $(count "/dev/mapper/$(mapping_of 1)")"
  echo "pattern lines on the raw device /dev/loop0: $(count /dev/loop0)"
  awk '{print $1, $2, $3, $4, $5, $6, "/dev/loop0", $8}' /tmp/old-table | dmsetup create old-key || return 1
  rm -f /tmp/old-table
  echo "pattern lines read with the old data key: $(count /dev/mapper/old-key)"
  dmsetup remove old-key
  echo "records left in the re-encryption directory: $(ls /tmp/reencrypt | wc -l)"
  echo "audit: $(as auditor audit query --subsystem "$ENC" --kind key_rotation | grep -c 're-encrypted to v2')"
}

# Crypto-erase: namespace 1 removed with --erase; the target closes the
# mapping, then the gateway destroys the data key (logged). The ciphertext
# stays on the device; a namespace made again on it gets a new key, which
# reads none of it.
at_rest_erase() {
  local m before after
  m=$(mapping_of 1)
  before=$(head -c 1048576 /dev/loop0 | sha256sum | cut -c1-16)
  as admin inventory namespace remove "$ENC" 1 --erase || return 1
  [ -e "/dev/mapper/$m" ] && echo "mapping $m still open" || echo "mapping closed"
  [ -d "$CFS/subsystems/$ENC/namespaces/1" ] && echo "namespace 1 still on the target" || echo "namespace 1 gone from the target"
  after=$(head -c 1048576 /dev/loop0 | sha256sum | cut -c1-16)
  [ "$before" = "$after" ] && echo "the ciphertext is still on /dev/loop0 ($(count /dev/loop0) pattern lines in it)"
  echo "audit: $(as auditor audit query --subsystem "$ENC" --kind key_rotation | grep -c 'crypto-erase') crypto-erase entries"
}
at_rest_after_erase() {
  as admin inventory namespace add "$ENC" 1 --tenant acme --region eu-west --class restricted \
    --dataset vm/enc1 --digest "$DIGEST" --backing-device /dev/loop0 >/dev/null || return 1
  for _ in $(seq 300); do [ "$(cat "$CFS/subsystems/$ENC/namespaces/1/enable" 2>/dev/null)" = 1 ] && break; sleep 0.1; done
  echo "namespace 1 made again on /dev/loop0, with a new data key: pattern lines through its mapping: $(count "/dev/mapper/$(mapping_of 1)")"
  as admin inventory namespace remove "$ENC" 1 --erase
}
# Figures: throughput over the fabric to namespace 2 (encrypted, on
# /dev/loop1) and to namespace 3, which the operator adds by hand on
# /dev/loop2 without encryption (the agent leaves it alone); 16 MiB written
# (fsync) and read (caches dropped) each, timed with /proc/uptime. And the
# target agent's memory while it holds the data keys.
at_rest_figures() {
  local ns3="$CFS/subsystems/$ENC/namespaces/3" dev t0 t1
  dd if=/dev/zero of=/tmp/disk2.img bs=1M count=32 2>/dev/null && losetup /dev/loop2 /tmp/disk2.img || return 1
  mkdir "$ns3" && echo /dev/loop2 > "$ns3/device_path" && echo 1 > "$ns3/enable" || return 1
  # A job of its own: vm-enc-1 names namespace 1, which is erased.
  as acme-scheduler job admit vm-fig-1 --tenant acme --node "$AT_REST_NODE" --namespace "$ENC/2:rw" --region eu-west --expires-in 1h >/dev/null || return 1
  start_node_agent vm-fig-1 acme-node-1 $AT_REST_AGENT >/tmp/fig-agent.out || { cat /tmp/fig-agent.out; return 1; }
  head -c 16777216 /dev/urandom > /tmp/rand.bin
  for n in 2 3; do
    dev=$(ns_dev $n) || { echo "no block device for namespace $n"; return 1; }
    t0=$(uptime_cs); dd if=/tmp/rand.bin of="$dev" bs=1M conv=fsync 2>/dev/null || return 1; t1=$(uptime_cs)
    w=$((t1 - t0))
    echo 3 > /proc/sys/vm/drop_caches
    t0=$(uptime_cs); dd if="$dev" of=/dev/null bs=1M count=16 2>/dev/null || return 1; t1=$(uptime_cs)
    r=$((t1 - t0))
    echo "throughput namespace $n ($([ $n = 2 ] && echo "dm-crypt" || echo "plain")): write 16 MiB in $((w * 10)) ms, read 16 MiB in $((r * 10)) ms"
  done
  echo "target agent memory: $(grep -E 'VmRSS' "/proc/$(pidof nvmegate-target)/status" | tr -s ' \t' ' ')"
  kill -TERM "$NODE_PID"; wait "$NODE_PID"
  echo 0 > "$ns3/enable"; rmdir "$ns3"
}

# at_rest_compliance: the auditor's compliance attestation, verified
# offline with the log's exported key, says which namespaces are encrypted.
at_rest_compliance() {
  rm -rf /tmp/export
  as auditor audit export --out /tmp/export >/dev/null || return 1
  as auditor attest compliance > /tmp/compliance.json 2>/dev/null || return 1
  nvmegate attest verify /tmp/compliance.json --key /tmp/export/keys/v1.pem | grep -E 'encrypted at rest|result'
}

# at_rest_story SUBSYSTEM_FLAGS...: the encryption-at-rest steps, on a new
# subsystem of acme's made with SUBSYSTEM_FLAGS (6.12: --dhchap --tls).
at_rest_story() {
  step at-rest-disks at_rest_disks
  step at-rest-subsystem as admin inventory subsystem add "$ENC" --target stor-eu-1 --tenant acme --ports 1 "$@"
  for n in 1 2; do
    step "at-rest-namespace-$n" as admin inventory namespace add "$ENC" "$n" --tenant acme --region eu-west --class restricted \
      --dataset "vm/enc$n" --digest "$DIGEST" --backing-device "/dev/loop$((n - 1))"
  done
  step at-rest-mapped at_rest_mapped
  step at-rest-compliance at_rest_compliance
  step at-rest-job as acme-scheduler job admit vm-enc-1 --tenant acme --node "$AT_REST_NODE" --namespace "$ENC/1:rw" --namespace "$ENC/2:rw" \
    --region eu-west --expires-in 2h
  step at-rest-connect start_node_agent vm-enc-1 acme-node-1 $AT_REST_AGENT
  step at-rest-write at_rest_write
  step at-rest-raw at_rest_raw
  step at-rest-other-key at_rest_other_key
  step at-rest-restart at_rest_restart
  step at-rest-stop agent_stop "$ENC" "$(nvmegate hostnqn "$AT_REST_NODE")"
  step at-rest-reencrypt at_rest_reencrypt
  step at-rest-erase at_rest_erase
  step at-rest-after-erase at_rest_after_erase
  step at-rest-figures at_rest_figures
}

# --- Kubernetes through nvmegate-csi (story.sh's csi-* steps) ---------------
# The CSI driver's plugins as a cluster runs them: acme's controller (as
# acme's scheduler), a node plugin on each of two GPU nodes (as the node),
# and globex's controller for the other tenant's pod. csi-kubelet makes the
# calls the external-attacher and the kubelet make, in their order.
CSI=/tmp/csi
csi_node() {
  nvmegate-csi node --endpoint "unix://$CSI/node$1.sock" --dev-dir "$G" --dev-identity "acme-node-$1" --state-dir "$CSI/state$1" \
    --path-root "$CSI" --renew-every 2s --connect-timeout 60s >>"$CSI/node$1.log" 2>&1 &
  echo $! > "$CSI/node$1.pid"
}
# csi_node_restart N POD: node N's plugin is killed (-9) while POD's volume
# is staged and started again: it takes the volume back from its state
# (the live controller adopted, the grant renewed), and the pod reads on.
csi_node_restart() {
  local pid; pid=$(cat "$CSI/node$1.pid")
  kill -9 "$pid"; wait "$pid" 2>/dev/null
  echo "node $1's plugin killed; controllers left: $(ls /sys/class/nvme | tr '\n' ' ')"
  csi_node "$1"
  for _ in $(seq 300); do grep -q 'took back a staged volume' "$CSI/node$1.log" && break; sleep 0.1; done
  grep -o 'msg="took back a staged volume".*' "$CSI/node$1.log" || { tail -20 "$CSI/node$1.log"; return 1; }
  grep -o 'msg="took over a live controller"[^ ]* [^ ]*' "$CSI/node$1.log" | tail -1
  csi_read "$2"
}
csi_start() {
  mkdir -p "$CSI"
  local p
  nvmegate-csi controller --endpoint "unix://$CSI/ctrl.sock" --dev-dir "$G" --dev-identity acme-scheduler --region eu-west >"$CSI/ctrl.log" 2>&1 &
  nvmegate-csi controller --endpoint "unix://$CSI/gctrl.sock" --dev-dir "$G" --dev-identity globex-scheduler --region eu-west >"$CSI/gctrl.log" 2>&1 &
  for n in 1 2; do csi_node "$n"; done
  for p in ctrl gctrl node1 node2; do
    for _ in $(seq 300); do [ -S "$CSI/$p.sock" ] && break; sleep 0.1; done
    [ -S "$CSI/$p.sock" ] || { echo "$p did not start"; cat "$CSI/$p.log"; return 1; }
    echo "$p serving on $CSI/$p.sock"
  done
}
csi_kubelet() { csi-kubelet "$@" --root "$CSI/kubelet"; }
# csi_create NAMESPACE PVC: the external-provisioner's CreateVolume for a
# claim of the dataset (--extra-create-metadata names the claim: the job is
# NAMESPACE.PVC).
csi_create() {
  csi_kubelet create --controller "$CSI/ctrl.sock" --name "pvc-$2" --mode rox --param dataset=vm/acme \
    --param csi.storage.k8s.io/pvc/namespace="$1" --param csi.storage.k8s.io/pvc/name="$2" > "$CSI/create.out"
  local rc=$?
  cat "$CSI/create.out"
  sed -n 's/^volume //p' "$CSI/create.out" > "$CSI/vol-$2"
  cp "$CSI/vol-$2" "$CSI/volume"
  return $rc
}
# csi_sanity: the CSI project's whole suite against acme's controller and
# node 1, staging for real; its volumes are ReadWriteOnce (csi-sanity asks
# SINGLE_NODE_WRITER), which policy allows for acme's internal class.
csi_sanity() {
  [ -x /bin/csi-sanity ] || { echo "csi-sanity is not in the initramfs (make test builds it: NVMEGATE_CSI_SANITY)"; return 1; }
  printf 'dataset: "vm/acme"\njob: "vm-sanity-1"\n' > "$CSI/params.yaml"
  csi-sanity --csi.endpoint "$CSI/node1.sock" --csi.controllerendpoint "$CSI/ctrl.sock" \
    --csi.stagingdir "$CSI/sanity-staging" --csi.mountdir "$CSI/sanity-mount" --csi.testvolumeaccesstype block \
    --csi.testvolumeparameters "$CSI/params.yaml" --ginkgo.no-color --ginkgo.v > "$CSI/sanity.out" 2>&1
  local rc=$?
  grep -E '^[[:space:]]*\[FAIL' "$CSI/sanity.out" | head -20
  grep -E '^(Ran [0-9]+ of|SUCCESS!|FAIL!)' "$CSI/sanity.out"
  if [ $rc != 0 ]; then
    grep -B2 -A25 'Unexpected error' "$CSI/sanity.out" | head -80
    grep -E 'level=(WARN|ERROR)' "$CSI/node1.log" "$CSI/ctrl.log" | grep -v 'is required' | head -20
  fi
  return $rc
}
# csi_attach N POD [PVC]: pod POD of the job placed on node N, with the
# volume of claim PVC (default: the last one created).
csi_attach() { csi_kubelet attach --controller "$CSI/ctrl.sock" --node "$CSI/node$1.sock" --volume "$(cat "$CSI/vol-${3:-}" 2>/dev/null || cat "$CSI/volume")" --mode rox --pod "$2"; }
csi_detach() { csi_kubelet detach --controller "$CSI/ctrl.sock" --node "$CSI/node$1.sock" --volume "$(cat "$CSI/vol-${3:-}" 2>/dev/null || cat "$CSI/volume")" --pod "$2"; }
# csi_job_ended JOB POD: an admin finishes JOB while POD reads its
# volume; the node plugin's agent sees its grants end and takes the
# device from the pod (its path is gone), so that no later namespace can
# answer at that path.
csi_job_ended() {
  local t; t=$(csi_target "$2")
  [ -b "$t" ] || { echo "pod $2 has no device to begin with"; return 1; }
  as admin job finish "$1" --reason "vm: the job ends under its pod" >/dev/null || return 1
  for _ in $(seq 300); do [ -e "$t" ] || break; sleep 0.1; done
  [ -e "$t" ] && { echo "pod $2 still has $t after its job finished"; return 1; }
  echo "pod $2's device taken away after its job finished"
  grep -o 'msg="the job'"'"'s grants ended: its device is taken from its pods".*' "$CSI/node1.log" | tail -1
  ls /sys/class/nvme | tr '\n' ' '; echo "(controllers left)"
}
csi_target() { ls -d "$CSI"/kubelet/pods/"$1"/volumeDevices/* 2>/dev/null | head -1; }
# csi_read POD: the pod reads its dataset through the path it was given.
csi_read() {
  local t; t=$(csi_target "$1")
  [ -b "$t" ] || { echo "pod $1 has no block device"; return 1; }
  echo "pod $1 read $(dd if="$t" bs=4096 count=16 2>/dev/null | wc -c) bytes of its dataset through $t"
}
# csi_write POD: a write to the read-only dataset; the node's kernel must refuse it.
csi_write() {
  local t; t=$(csi_target "$1")
  if dd if=/dev/zero of="$t" bs=4096 count=1 conv=fsync 2>/tmp/csi-write.err; then
    echo "pod $1 WROTE to its read-only dataset"; return 1
  fi
  echo "pod $1's write refused: $(grep -v records /tmp/csi-write.err | head -1)"
}
# csi_after SUB HOST...: after both pods left: no host on the subsystem,
# the job finished, its story in the audit log.
csi_after() {
  local sub=$1 h; shift
  for h in "$@"; do
    [ -e "$CFS/subsystems/$sub/allowed_hosts/$h" ] && { echo "host $h still allowed on $sub"; return 1; }
    echo "host $h not allowed on $sub"
  done
  as admin -o json job get team-a.pods-1 | grep -E '"(state|generation)"'
  as auditor audit query --job team-a.pods-1 | grep -oE '(jobs\.[a-z_]+|access\.[a-z]+) [^ ]*( generation [0-9]+)?' | sort | uniq -c
}
# csi_stage_time N: N rounds of the node agent's own connect (its process
# started to the namespace's block device in /dev) beside NodeStageVolume's
# (the call's time in the running plugin, to the same device), each on a
# fresh job with nothing else connected; medians.
csi_stage_time() {
  local i t0 t1 a s dev
  : > /tmp/agent-ms; : > /tmp/stage-ms
  for f in /dev/nvme*n*; do [ -b "$f" ] && { echo "a namespace is connected already: $f"; return 1; }; done
  for i in $(seq "$1"); do
    as acme-scheduler job admit "vm-bench-a$i" --tenant acme --node spiffe://nvmegate.test/node/acme-gpu-1 \
      --namespace "$ACME/1:ro" --region eu-west --expires-in 1h >/dev/null || return 1
    t0=$(uptime_cs)
    nvmegate-node run --dev-dir "$G" --dev-identity acme-node-1 --job "vm-bench-a$i" --renew-every 2s --status-socket /tmp/bench.sock >/tmp/bench-agent.log 2>&1 &
    a=$!
    dev=""
    for _ in $(seq 3000); do
      for f in /dev/nvme*n*; do [ -b "$f" ] && dev=$f; done
      [ -n "$dev" ] && break
      sleep 0.01
    done
    t1=$(uptime_cs)
    kill "$a"; wait "$a"
    [ -n "$dev" ] || { echo "the agent gave no device"; cat /tmp/bench-agent.log; return 1; }
    echo $(((t1 - t0) * 10)) >> /tmp/agent-ms
    as acme-scheduler job finish "vm-bench-a$i" >/dev/null || return 1
    csi_kubelet create --controller "$CSI/ctrl.sock" --name "bench-$i" --mode rox --param dataset=vm/acme --param "job=vm-bench-c$i" > /tmp/bench-create.out || { cat /tmp/bench-create.out; return 1; }
    v=$(sed -n 's/^volume //p' /tmp/bench-create.out)
    csi_kubelet attach --controller "$CSI/ctrl.sock" --node "$CSI/node1.sock" --volume "$v" --mode rox --pod "bench-$i" > /tmp/bench-attach.out || { cat /tmp/bench-attach.out; return 1; }
    sed -n 's/^NodeStageVolume OK in \([0-9]*\).*/\1/p' /tmp/bench-attach.out >> /tmp/stage-ms
    csi_kubelet detach --controller "$CSI/ctrl.sock" --node "$CSI/node1.sock" --volume "$v" --pod "bench-$i" >/dev/null || return 1
  done
  echo "node agent connect (ms): $(sort -n /tmp/agent-ms | tr '\n' ' ')"
  echo "NodeStageVolume (ms):    $(sort -n /tmp/stage-ms | tr '\n' ' ')"
  a=$(sort -n /tmp/agent-ms | sed -n "$((($1 + 1) / 2))p"); s=$(sort -n /tmp/stage-ms | sed -n "$((($1 + 1) / 2))p")
  echo "median: agent ${a} ms, NodeStageVolume ${s} ms, ratio $((s * 100 / a))/100"
}
