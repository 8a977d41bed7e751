# The story of the Linux 6.12 tier (Debian's own kernel, tlshd from Debian
# 13), run by /init inside the VM on its loopback: NVMe/TCP with TLS, the
# PSKs in the kernel's .nvme keyring, the TLS handshakes done by tlshd for
# host and target alike. Same step protocol as story.sh (see lib.sh); the
# host judges (e2e/vm_test.go).
. /lib.sh

SUBX=nqn.2026-01.io.nvmegate.vm:tls-only
NVME_CONNECT_EXTRA=--keyring=nvmegate-host
NODE1=spiffe://nvmegate.test/node/acme-gpu-1
NODE2=spiffe://nvmegate.test/node/acme-gpu-2

start_tlshd() {
  printf '[debug]\nloglevel=1\ntls=0\nnl=0\n[authenticate]\nkeyrings=.nvme\n[authenticate.client]\n[authenticate.server]\n' > /etc/tlshd.conf
  grep -q 'keyring   .nvme:' /proc/keys || { echo "no .nvme keyring"; return 1; }
  # The nodes' PSKs go to a keyring of their own: host and target share
  # this kernel, and a key a host put in .nvme would be the target's too.
  # (root's own ring: search and link for its uid, which nvme-cli needs to
  # hand it to the kernel.)
  ring=$(keyctl newring nvmegate-host @u) && keyctl setperm "$ring" 0x3f3f0000 || return 1
  tlshd -s >/tmp/tlshd.log 2>&1 &
  sleep 0.5
  kill -0 $! && echo "tlshd running ($(tlshd --version 2>&1 | head -1))"
}
# tlshd_says: what tlshd logged since the last call (handshake results).
tlshd_seen=0
tlshd_says() {
  local n; n=$(wc -l < /tmp/tlshd.log)
  sed -n "$((tlshd_seen+1)),${n}p" /tmp/tlshd.log | grep -iE 'handshake|psk' | sed 's/^/tlshd: /'
  tlshd_seen=$n
}
# connect_args NAME: nvme connect with a grant's printed arguments, then
# what tlshd logged.
tls_connect() { nvme_connect "$1"; local rc=$?; sleep 0.3; tlshd_says; return $rc; }

# The impersonation, as an nvmet TLS target without nvmegate's rule is
# configured: a TLS port (4421), a subsystem allowing two hosts A and B by
# TLS alone, A's PSK in the .nvme keyring. A host holding A's PSK connects
# claiming to be B.
HA=nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-4000-8000-000000000000
HB=nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-4000-8000-000000000000
tls_only_target() {
  mkdir -p "$CFS/ports/2" "$CFS/subsystems/$SUBX/namespaces/1" "$CFS/hosts/$HA" "$CFS/hosts/$HB" || return 1
  echo /dev/nullb1 > "$CFS/subsystems/$SUBX/namespaces/1/device_path"; echo 1 > "$CFS/subsystems/$SUBX/namespaces/1/enable"
  echo 0 > "$CFS/subsystems/$SUBX/attr_allow_any_host"
  ln -s "$CFS/hosts/$HA" "$CFS/subsystems/$SUBX/allowed_hosts/$HA"
  ln -s "$CFS/hosts/$HB" "$CFS/subsystems/$SUBX/allowed_hosts/$HB"
  echo tcp > "$CFS/ports/2/addr_trtype"; echo ipv4 > "$CFS/ports/2/addr_adrfam"
  echo 127.0.0.1 > "$CFS/ports/2/addr_traddr"; echo 4421 > "$CFS/ports/2/addr_trsvcid"
  echo tls1.3 > "$CFS/ports/2/addr_tsas" || return 1
  ln -s "$CFS/subsystems/$SUBX" "$CFS/ports/2/subsystems/$SUBX" || return 1
  key=$(nvme gen-tls-key --hmac=1 2>/dev/null | grep -o 'NVMeTLSkey-1:[^ ]*') || return 1
  nvme check-tls-key --keydata="$key" --hostnqn="$HA" --subsysnqn="$SUBX" --identity=1 --insert >/tmp/tlsonly.insert 2>&1 || { cat /tmp/tlsonly.insert; return 1; }
  grep -o "psk *NVMe1R01 $HA $SUBX" /proc/keys | head -1
  printf 'port 2: addr_tsas %s, addr_treq %s\n' "$(cat "$CFS/ports/2/addr_tsas")" "$(cat "$CFS/ports/2/addr_treq")"
}
# serial_of HOST SUB [RING]: the hex serial of HOST's v1 PSK for SUB in
# RING (default .nvme) itself.
serial_of() {
  local ring k
  ring=$(grep "keyring   ${3:-.nvme}:" /proc/keys | cut -d' ' -f1)
  for k in $(keyctl rlist "$((0x$ring))"); do
    keyctl rdescribe "$k" | grep -q "^psk;.*;NVMe1R01 $1 $2 " && { printf '%08x\n' "$k"; return; }
  done
}
impersonate() { # SUB HOSTNQN-CLAIMED KEY-OWNER PORT RING [dhchap args]
  local sub=$1 claim=$2 owner=$3 port=$4 ring=$5; shift 5
  local s; s=$(serial_of "$owner" "$sub" "$ring")
  [ -n "$s" ] || { echo "no PSK of $owner for $sub in the keyring"; return 2; }
  echo "connecting as $claim with the PSK of $owner (key 0x$s)"
  nvme connect -t tcp -a 127.0.0.1 -s "$port" -n "$sub" --hostnqn="$claim" --tls --keyring="$ring" --tls-key="0x$s" "$@" >/dev/null 2>/tmp/imp.err
  local rc=$?
  sleep 0.3
  [ $rc -eq 0 ] && { dev=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1); echo "connected: block device /dev/$dev"; dd if="/dev/$dev" of=/dev/null bs=4096 count=1 2>&1 | tail -1; } || cat /tmp/imp.err
  tlshd_says
  return $rc
}
tls_only_teardown() {
  nvme disconnect-all >/dev/null 2>&1
  rm -f "$CFS/ports/2/subsystems/$SUBX" "$CFS/subsystems/$SUBX/allowed_hosts/"*
  echo 0 > "$CFS/subsystems/$SUBX/namespaces/1/enable"
  ring=$(grep 'keyring   .nvme:' /proc/keys | cut -d' ' -f1)
  keyctl unlink "$((0x$(serial_of "$HA" "$SUBX")))" "$((0x$ring))" >/dev/null || return 1
  rmdir "$CFS/subsystems/$SUBX/namespaces/1" "$CFS/subsystems/$SUBX" "$CFS/hosts/$HA" "$CFS/hosts/$HB" "$CFS/ports/2" && echo "removed"
}

acme_namespace() {
  mkdir -p "$CFS/subsystems/$ACME/namespaces/1" || return 1
  echo /dev/nullb0 > "$CFS/subsystems/$ACME/namespaces/1/device_path" || return 1
  echo 1 > "$CFS/subsystems/$ACME/namespaces/1/enable" || return 1
  ls "$CFS/subsystems"
}
# keys: the PSK identities in the .nvme keyring itself (descriptions, no
# payloads; the nodes' own ring is not listed).
keys() {
  local ring k
  ring=$(grep 'keyring   .nvme:' /proc/keys | cut -d' ' -f1)
  for k in $(keyctl rlist "$((0x$ring))"); do keyctl rdescribe "$k" | sed -n 's/^psk;[^;]*;[^;]*;[^;]*;//p'; done | sort
}
# keyids: the key serials and identities in .nvme: a re-key replaces a
# host's PSKs (new keys, new serials), never adds to them.
keyids() {
  local ring k
  ring=$(grep 'keyring   .nvme:' /proc/keys | cut -d' ' -f1)
  for k in $(keyctl rlist "$((0x$ring))"); do echo "$k $(keyctl rdescribe "$k" | sed -n 's/^psk;[^;]*;[^;]*;[^;]*;//p')"; done | sort -k2
}
# wrong_psk NAME: the grant's connect line with another, valid PSK.
wrong_psk() {
  other=$(nvme gen-tls-key --hmac=1 2>/dev/null | grep -o 'NVMeTLSkey-1:[^ ]*')
  sed "s|--tls-key=[^ ]*|--tls-key=$other|; s| '--tls-key-identity=[^']*'||" "/tmp/$1.args" > "/tmp/$1-wrong.args"
  tls_connect "$1-wrong"
}

echo "== story 6.12"
step kernel sh -c 'uname -r; grep " .nvme:" /proc/keys | sed "s/^.*keyring/keyring/"; nvme version | head -2'
step tlshd start_tlshd
step impersonation-before-setup tls_only_target
step impersonation-before impersonate "$SUBX" "$HB" "$HA" 4421 .nvme
step keyring-before sh -c "grep -E ' psk |nvme' /proc/keys"
step disconnect-before disconnect
step impersonation-before-teardown tls_only_teardown
step gateway start_gateway
step target-add as admin inventory target add stor-eu-1 --fabric fab-vm --region eu-west --driver nvmet \
  --port id=1,transport=tcp,family=ipv4,address=127.0.0.1,service=4420,secure=required
step acme-subsystem-add as admin inventory subsystem add "$ACME" --target stor-eu-1 --tenant acme --ports 1 --dhchap --tls
step acme-namespace-add as admin inventory namespace add "$ACME" 1 --tenant acme --region eu-west --class restricted \
  --dataset vm/acme --digest "$DIGEST"
for n in 1 2; do
  step "acme-host-$n" as admin inventory host add "spiffe://nvmegate.test/node/acme-gpu-$n" \
    --nqn "$(nvmegate hostnqn "spiffe://nvmegate.test/node/acme-gpu-$n")" --tenant acme
done
step operator-namespace acme_namespace
step agent start_agent
step acme-job as acme-scheduler job admit vm-train-1 --tenant acme --node "$NODE1" --node "$NODE2" \
  --namespace "$ACME/1:ro" --region eu-west --expires-in 2h
step grant-node1 grant node1 acme-node-1 connect --job vm-train-1 --subsystem "$ACME"
step keys-after-grant keys
step keyids-after-grant keyids
step tree-after-grant tree
step tls-connect-node1 tls_connect node1
step tls-key-node1 sh -c 'for c in /sys/class/nvme/nvme*; do k=$(cat $c/tls_key); echo "$(basename $c): state $(cat $c/state), TLS key $k: $(grep "^$k " /proc/keys | sed "s/^.* psk *//")"; done'
step rekey-live rekey_live node1 acme-node-1
step keyids-after-rekey keyids
step disconnect-node1 disconnect
step tls-old-after-rekey tls_connect node1
step disconnect-old-after-rekey disconnect
step tls-wrong-psk wrong_psk node1
step disconnect-wrong disconnect
step grant-node2 grant node2 acme-node-2 connect --job vm-train-1 --subsystem "$ACME"
step tls-connect-node2 tls_connect node2
step disconnect-node2 disconnect
# A host holding node 1's PSK (the same key as the node's, here by its
# serial in .nvme: host and target share this kernel) claims to be node 2:
# TLS succeeds, DH-HMAC-CHAP inside it does not.
N1=$(nvmegate hostnqn "$NODE1"); N2=$(nvmegate hostnqn "$NODE2")
step impersonation-after impersonate "$ACME" "$N2" "$N1" 4420 .nvme
step disconnect-imp-after disconnect
impersonate_own_secret() { impersonate "$ACME" "$N2" "$N1" 4420 .nvme $(grep -o -- '--dhchap-secret=[^ ]*' /tmp/node1.args); }
step impersonation-after-own-secret impersonate_own_secret
step disconnect-imp-own disconnect
step revoke-node1 as admin revoke --node "$NODE1" --reason "vm revocation"
step keys-after-revoke keys
step tls-after-revoke tls_connect node1
step disconnect-after-revoke disconnect
step finish-job as acme-scheduler job finish vm-train-1 --reason done
step keys-after-finish keys
step tree-after-finish tree
# The node agent: a new job for node 1; nvmegate-node connects it by
# itself (its PSK in a keyring of its own, TLS and DH-HMAC-CHAP through
# /dev/nvme-fabrics), re-keys the live controller after a rotation, and
# on SIGTERM leaves nothing behind.
agent_tls() {
  local ctrl k; ctrl=$(node_json controller); k=$(cat "/sys/class/nvme/$ctrl/tls_key")
  echo "$ctrl: state $(cat "/sys/class/nvme/$ctrl/state"), TLS key $k: $(grep "^$k " /proc/keys | sed 's/^.* psk *//')"
  tlshd_says
}
agent_keys() { ring=$(grep 'keyring   nvmegate-node:' /proc/keys | cut -d' ' -f1); [ -n "$ring" ] || { echo "no nvmegate-node keyring"; return 0; }
  echo "nvmegate-node ring: $(keyctl rlist "$((0x$ring))" | wc -w) key(s)"; }
step agent-job as acme-scheduler job admit vm-agent-1 --tenant acme --node "$NODE1" --namespace "$ACME/1:ro" --region eu-west --expires-in 2h
step agent-start start_node_agent vm-agent-1 acme-node-1 --keyring nvmegate-node
step agent-tls agent_tls
step agent-rekey agent_rekey "$ACME"
step agent-restart agent_restart vm-agent-1 acme-node-1 --keyring nvmegate-node
step agent-old-secret agent_old_secret "$ACME" ",tls,keyring=$((0x$(grep 'keyring   nvmegate-node:' /proc/keys | cut -d' ' -f1)))"
step agent-stop agent_stop "$ACME" "$N1"
step agent-keys-after-stop agent_keys
# The CSI driver over TLS (lib.sh: csi_*): a pod's volume staged by the
# node plugin with the grant's PSK in its keyring, TLS keyed by tlshd and
# DH-HMAC-CHAP inside it; unstaged, no key left.
csi_tls_key() {
  local c
  for c in /sys/class/nvme/nvme*; do
    k=$(cat "$c/tls_key"); echo "$(basename "$c"): state $(cat "$c/state"), TLS key $k: $(grep "^$k " /proc/keys | sed 's/^.* psk *//')"
  done
  tlshd_says
}
step csi-tls-plugins csi_start
step csi-tls-create csi_create team-a tls-1
step csi-tls-pod csi_attach 1 pod-t
step csi-tls-key csi_tls_key
step csi-tls-read csi_read pod-t
step csi-tls-detach csi_detach 1 pod-t
step csi-tls-keys-after agent_keys
# Encryption at rest (lib.sh: at_rest_story), over TLS here.
AT_REST_AGENT="--keyring nvmegate-node"
at_rest_story --dhchap --tls

# Figures: NVMe/TCP connect time without and with TLS, without and with
# DH-HMAC-CHAP, on a hand-made subsystem with a plain port (4422) and a
# TLS port (4423): host T1 without a DH-HMAC-CHAP key, T2 with one, both
# with a PSK in .nvme (v0 identity: the kernel's default lookup). Each
# variant connects 10 times; /proc/uptime has centiseconds, so the mean
# of 10 is good to a millisecond. Every connect sets up the admin queue
# and one I/O queue per CPU: with TLS, a handshake each.
SUBT=nqn.2026-01.io.nvmegate.vm:timing
T1=nqn.2014-08.org.nvmexpress:uuid:000000c1-0000-4000-8000-000000000000
T2=nqn.2014-08.org.nvmexpress:uuid:000000c2-0000-4000-8000-000000000000
timing_target() {
  # The target agent prunes host entries it did not make: it stops first.
  kill -TERM "$(pidof nvmegate-target)" 2>/dev/null; sleep 0.5
  mkdir -p "$CFS/ports/3" "$CFS/ports/4" "$CFS/subsystems/$SUBT/namespaces/1" "$CFS/hosts/$T1" "$CFS/hosts/$T2" || return 1
  echo /dev/nullb1 > "$CFS/subsystems/$SUBT/namespaces/1/device_path"; echo 1 > "$CFS/subsystems/$SUBT/namespaces/1/enable"
  echo 0 > "$CFS/subsystems/$SUBT/attr_allow_any_host"
  for h in "$T1" "$T2"; do
    ln -s "$CFS/hosts/$h" "$CFS/subsystems/$SUBT/allowed_hosts/$h" || return 1
    nvme check-tls-key --keydata="$(nvme gen-tls-key --hmac=1 2>/dev/null | grep -o 'NVMeTLSkey-1:[^ ]*')" \
      --hostnqn="$h" --subsysnqn="$SUBT" --identity=0 --insert >/dev/null 2>&1 || return 1
  done
  nvme gen-dhchap-key --nqn="$T2" --hmac=1 2>/dev/null | grep -o 'DHHC-1:[^ ]*' > /tmp/t2.secret || return 1
  cat /tmp/t2.secret > "$CFS/hosts/$T2/dhchap_key"; echo 'hmac(sha256)' > "$CFS/hosts/$T2/dhchap_hash"; echo ffdhe2048 > "$CFS/hosts/$T2/dhchap_dhgroup"
  for p in 3:4422 4:4423; do
    id=${p%:*}; svc=${p#*:}
    echo tcp > "$CFS/ports/$id/addr_trtype"; echo ipv4 > "$CFS/ports/$id/addr_adrfam"
    echo 127.0.0.1 > "$CFS/ports/$id/addr_traddr"; echo "$svc" > "$CFS/ports/$id/addr_trsvcid"
    [ "$id" = 4 ] && { echo tls1.3 > "$CFS/ports/$id/addr_tsas" || return 1; }
    ln -s "$CFS/subsystems/$SUBT" "$CFS/ports/$id/subsystems/$SUBT" || return 1
  done
  grep -c "psk *NVMe0R01 .* $SUBT" /proc/keys | sed 's/$/ PSKs in .nvme/'
}
# time_connects NAME ARGS...: 10 connects with ARGS, each disconnected after.
time_connects() {
  local name=$1 total=0 t0 t1; shift
  for _ in $(seq 10); do
    t0=$(uptime_cs)
    nvme connect -t tcp -a 127.0.0.1 -n "$SUBT" "$@" >/tmp/tc.err 2>&1 || { echo "$name: connect failed"; cat /tmp/tc.err; return 1; }
    t1=$(uptime_cs)
    total=$((total + t1 - t0))
    nvme disconnect -n "$SUBT" >/dev/null 2>&1
  done
  # total centiseconds over 10 connects = the mean in milliseconds
  echo "timing $name: mean $total ms over 10 connects"
}
tls_timing() {
  time_connects plain -s 4422 --hostnqn="$T1" || return 1
  time_connects dhchap -s 4422 --hostnqn="$T2" --dhchap-secret="$(cat /tmp/t2.secret)" || return 1
  time_connects tls -s 4423 --hostnqn="$T1" --tls || return 1
  time_connects tls+dhchap -s 4423 --hostnqn="$T2" --tls --dhchap-secret="$(cat /tmp/t2.secret)" || return 1
  echo "queues per connect: 1 admin + $(nproc 2>/dev/null || grep -c ^processor /proc/cpuinfo) I/O"
}
step timing-target timing_target
step timing tls_timing
# bidir_rekey: how this kernel takes a live re-key of a bidirectional
# DH-HMAC-CHAP controller (both secrets new), which Linux 6.1 does not
# survive (the host and controller secrets are two sysfs writes, and the
# re-authentication between them fails): on the hand-made target, host T2
# connects with both secrets, a read loop runs, the target's entry gets
# both new secrets, and the host's two attributes are written in turn.
# It reports what happened; the agent's make-before-break does not depend on it.
bidir_rekey() {
  local ctrl dev
  nvme gen-dhchap-key --nqn="$SUBT" --hmac=1 2>/dev/null | grep -o 'DHHC-1:[^ ]*' > /tmp/t2.ctrl || return 1
  cat /tmp/t2.ctrl > "$CFS/hosts/$T2/dhchap_ctrl_key"
  nvme connect -t tcp -a 127.0.0.1 -s 4422 -n "$SUBT" --hostnqn="$T2" --dhchap-secret="$(cat /tmp/t2.secret)" \
    --dhchap-ctrl-secret="$(cat /tmp/t2.ctrl)" >/tmp/bd.err 2>&1 || { echo "bidirectional connect failed"; cat /tmp/bd.err; return 1; }
  for _ in $(seq 50); do dev=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | head -1); [ -n "$dev" ] && break; sleep 0.1; done
  ctrl=$(ls /sys/class/nvme | head -1)
  [ -n "$dev" ] || { echo "no block device"; return 1; }
  echo "connected $ctrl with both secrets, state $(cat "/sys/class/nvme/$ctrl/state")"
  start_reads "/dev/$dev"
  nvme gen-dhchap-key --nqn="$T2" --hmac=1 2>/dev/null | grep -o 'DHHC-1:[^ ]*' > /tmp/t2.secret2 || return 1
  nvme gen-dhchap-key --nqn="$SUBT" --hmac=1 2>/dev/null | grep -o 'DHHC-1:[^ ]*' > /tmp/t2.ctrl2 || return 1
  cat /tmp/t2.secret2 > "$CFS/hosts/$T2/dhchap_key"; cat /tmp/t2.ctrl2 > "$CFS/hosts/$T2/dhchap_ctrl_key"
  printf %s "$(cat /tmp/t2.secret2)" > "/sys/class/nvme/$ctrl/dhchap_secret" 2>/tmp/bd.err || echo "host secret write: $(cat /tmp/bd.err)"
  printf %s "$(cat /tmp/t2.ctrl2)" > "/sys/class/nvme/$ctrl/dhchap_ctrl_secret" 2>/tmp/bd.err || echo "controller secret write: $(cat /tmp/bd.err)"
  sleep 3
  stop_reads
  if [ -e "/sys/class/nvme/$ctrl" ]; then
    echo "outcome: controller $ctrl state $(cat "/sys/class/nvme/$ctrl/state")"
  else
    echo "outcome: controller $ctrl gone"
  fi
  nvme disconnect -n "$SUBT" >/dev/null 2>&1
  return 0
}
# The probe hangs this kernel under emulation in some runs (nvmet ends the
# controller as a fatal error during the re-authentication, and the
# host's workers then block for good: issue 34's flake, twice in a row on
# a CI machine): it runs only when asked (NVMEGATE_VM612_PROBES=1 puts
# nvmegate.probes=1 on the kernel's command line).
if grep -q 'nvmegate.probes=1' /proc/cmdline; then
  step bidir-rekey bidir_rekey
fi
step gateway-log sh -c "grep -c . /tmp/gateway.log; grep -ciE 'panic|DHHC-1|NVMeTLSkey' /tmp/gateway.log /tmp/agent.log /tmp/tlshd.log /tmp/node.log || true"
