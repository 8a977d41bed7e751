# The story of the real-kernel e2e tier, run by /init inside the VM, all on
# its loopback: a dev gateway, stor-eu-1's target agent writing the real nvmet
# configfs, the admin's inventory, two tenants' jobs, and nodes connecting
# with nvme-cli using the secrets the gateway granted them.
#
# It only acts and records; e2e/vm_test.go on the host judges. Each step is
#
#   @@BEGIN <name>
#   <the command's output>
#   @@EXIT <status>
#   @@KERNEL
#   <what the kernel logged during the step (dmesg -c)>
#   @@END <name>
#
. /lib.sh

echo "== story"
step configfs ls "$CFS"
step gateway start_gateway
step target-add as admin inventory target add stor-eu-1 --fabric fab-vm --region eu-west --driver nvmet \
  --port id=1,transport=tcp,family=ipv4,address=127.0.0.1,service=4420
step acme-subsystem-add as admin inventory subsystem add "$ACME" --target stor-eu-1 --tenant acme --ports 1 --dhchap
step globex-subsystem-add as admin inventory subsystem add "$GLOBEX" --target stor-eu-1 --tenant globex --ports 1 --dhchap
step acme-namespace-add as admin inventory namespace add "$ACME" 1 --tenant acme --region eu-west --class internal \
  --dataset vm/acme --digest "$DIGEST"
step globex-namespace-add as admin inventory namespace add "$GLOBEX" 1 --tenant globex --region eu-west --class restricted \
  --dataset vm/globex --digest "$DIGEST"
for n in 1 2; do
  step "acme-host-$n" as admin inventory host add "spiffe://nvmegate.test/node/acme-gpu-$n" \
    --nqn "$(nvmegate hostnqn "spiffe://nvmegate.test/node/acme-gpu-$n")" --tenant acme
done
step globex-host-1 as admin inventory host add spiffe://nvmegate.test/node/globex-gpu-1 \
  --nqn nqn.2014-08.org.nvmexpress:uuid:00000001-bbbb-4000-8000-000000000000 --tenant globex
step operator-namespaces operator_namespaces
step agent start_agent
step acme-job as acme-scheduler job admit vm-train-1 --tenant acme \
  --node spiffe://nvmegate.test/node/acme-gpu-1 --node spiffe://nvmegate.test/node/acme-gpu-2 \
  --namespace "$ACME/1:ro" --region eu-west --expires-in 2h
step globex-job as globex-scheduler job admit vm-ckpt-1 --tenant globex \
  --node spiffe://nvmegate.test/node/globex-gpu-1 --namespace "$GLOBEX/1:ro" --region eu-west --expires-in 2h

# acme-node-1: granted, the kernel authenticates it, the namespace appears.
step grant-node1 grant node1 acme-node-1 connect --job vm-train-1 --subsystem "$ACME"
step tree-after-connect tree
step nvme-connect-node1 nvme_connect node1
step disconnect-node1 disconnect
# Tenant isolation at the gateway.
step globex-node-refused as globex-node-1 connect --job vm-train-1 --subsystem "$ACME"
step acme-node-refused-globex as acme-node-1 connect --job vm-train-1 --subsystem "$GLOBEX"
# A rotation: hosts keep their key through the grace (a reconnect during a
# renewal window works); past it the target drops a host that did not renew,
# and the old secret is refused. The renewed secret connects, and the old
# one now fails DH-HMAC-CHAP itself.
step rotate as admin keys rotate --subsystem "$ACME" --reason "vm rotation"
step tree-after-rotate tree
step nvme-old-secret-in-grace nvme_connect node1
step disconnect-in-grace disconnect
step grace-ends wait_host_gone "$(nvmegate hostnqn spiffe://nvmegate.test/node/acme-gpu-1)"
step tree-after-grace tree
step nvme-old-secret-after-grace nvme_connect node1
step disconnect-after-grace disconnect
step renew-node1 grant node1-renewed acme-node-1 renew "$(grant_id node1)"
step tree-after-renew tree
step nvme-renewed-node1 nvme_connect node1-renewed
step disconnect-renewed disconnect
step nvme-old-secret-after-renew nvme_connect node1
step disconnect-old-after-renew disconnect
# A release: the host leaves the subsystem; its secrets no longer connect.
step release-node1 as acme-node-1 release "$(grant_id node1)"
step tree-after-release tree
step nvme-after-release nvme_connect node1-renewed
step disconnect-after-release disconnect
# A revocation: the same for acme-node-2.
step grant-node2 grant node2 acme-node-2 connect --job vm-train-1 --subsystem "$ACME"
step nvme-connect-node2 nvme_connect node2
step disconnect-node2 disconnect
step revoke-node2 as admin revoke --node spiffe://nvmegate.test/node/acme-gpu-2 --reason "vm revocation"
step nvme-after-revoke nvme_connect node2
step disconnect-after-revoke disconnect
# globex's restricted class: bidirectional DH-HMAC-CHAP with a stronger
# hash and group, the controller authenticating to the host too.
step grant-globex grant globex globex-node-1 connect --job vm-ckpt-1 --subsystem "$GLOBEX"
step nvme-connect-globex nvme_connect globex
step disconnect-globex disconnect
# A live re-key on 6.1: a new job, node 1 connected with a read loop
# running; rotation, renewal, the new secret written to the controller's
# sysfs attribute: re-authenticated in place, no read error; the old
# secret is refused after.
step rekey-job as acme-scheduler job admit vm-rekey-1 --tenant acme \
  --node spiffe://nvmegate.test/node/acme-gpu-1 --namespace "$ACME/1:ro" --region eu-west --expires-in 2h
step grant-rekey grant rekey acme-node-1 connect --job vm-rekey-1 --subsystem "$ACME"
step nvme-connect-rekey nvme_connect rekey
step rekey-live rekey_live rekey acme-node-1
step disconnect-rekey disconnect
step nvme-old-after-rekey nvme_connect rekey
step disconnect-old-after-rekey disconnect
step finish-rekey as acme-scheduler job finish vm-rekey-1 --reason done
# The node agent on 6.1, for globex's restricted class (bidirectional
# DH-HMAC-CHAP): a new globex node and job; nvmegate-node connects it by
# itself, hands the live controller both new secrets after a rotation, and
# on SIGTERM leaves nothing behind.
GN2=nqn.2014-08.org.nvmexpress:uuid:00000002-bbbb-4000-8000-000000000000
step globex-host-2 as admin inventory host add spiffe://nvmegate.test/node/globex-gpu-2 --nqn "$GN2" --tenant globex
step agent-job as globex-scheduler job admit vm-agent-1 --tenant globex \
  --node spiffe://nvmegate.test/node/globex-gpu-2 --namespace "$GLOBEX/1:ro" --region eu-west --expires-in 2h
step agent-start start_node_agent vm-agent-1 globex-node-2
step agent-rekey agent_rekey "$GLOBEX"
step agent-restart agent_restart vm-agent-1 globex-node-2
step agent-old-secret agent_old_secret "$GLOBEX"
step agent-stop agent_stop "$GLOBEX" "$GN2"
step finish-agent-job as globex-scheduler job finish vm-agent-1 --reason done
# Slurm's node hooks (lib.sh: slurm_hook): the Prolog returns once the
# job's namespace is connected, the task reads its dataset through the
# device the TaskProlog exported, and the Epilog leaves nothing behind.
AN1=$(nvmegate hostnqn spiffe://nvmegate.test/node/acme-gpu-1)
step slurm-hooks slurm_hooks_install acme-node-1 ""
step slurm-job as acme-scheduler job admit 7001 --tenant acme --node spiffe://nvmegate.test/node/acme-gpu-1 \
  --namespace "$ACME/1:ro" --region eu-west --expires-in 2h
step slurm-prolog slurm_hook nvmegate-node-prolog 7001 vm/acme
step slurm-task slurm_task 7001 vm/acme
step slurm-epilog slurm_epilog 7001 vm/acme "$ACME" "$AN1"
step slurm-finish as acme-scheduler job finish 7001
# Kubernetes through nvmegate-csi (lib.sh: csi_*): the CSI project's own
# suite, staging on this kernel; then two pods of one job on two nodes, as
# the external-attacher and the kubelet call the driver: published,
# staged, published to the pod; read; a write to the read-only dataset
# refused by the node's kernel; another tenant's pod refused with the
# policy's reason; unpublished, unstaged, unpublished from the node; the
# hosts off the target, the job's story in the audit log. Last, what
# NodeStageVolume costs beside the node agent's own connect.
AN2=$(nvmegate hostnqn spiffe://nvmegate.test/node/acme-gpu-2)
step csi-plugins csi_start
step csi-sanity csi_sanity
step csi-create csi_create team-a pods-1
step csi-pod-1 csi_attach 1 pod-1
step csi-pod-2 csi_attach 2 pod-2
step csi-read-1 csi_read pod-1
step csi-read-2 csi_read pod-2
step csi-write-ro csi_write pod-1
step csi-other-tenant csi_kubelet attach --controller "$CSI/gctrl.sock" --node "$CSI/node1.sock" --volume "$ACME/1@globex-steal-1" --mode rox --pod pod-g
step csi-detach-1 csi_detach 1 pod-1
step csi-read-2-after csi_read pod-2
step csi-node-restart csi_node_restart 2 pod-2
step csi-detach-2 csi_detach 2 pod-2
step csi-after csi_after "$ACME" "$AN1" "$AN2"
# A node serves one job per subsystem at a time; and a job finished under
# its pod takes the device from the pod.
step csi-create-r csi_create team-a pods-r
step csi-pod-r csi_attach 1 pod-r pods-r
step csi-create-o csi_create team-a pods-o
step csi-pod-o csi_attach 1 pod-o pods-o
step csi-detach-o csi_detach 1 pod-o pods-o
step csi-job-ended csi_job_ended team-a.pods-r pod-r
step csi-detach-r csi_detach 1 pod-r pods-r
step csi-stage-time csi_stage_time 5
# Encryption at rest (lib.sh: at_rest_story), with DH-HMAC-CHAP.
at_rest_story --dhchap
# The security team tightens residency: eu-west data only over fabric f1
# (the policy's own samples' fabric); the VM's target is on fab-vm. The hot
# reload re-decides globex's live grant and revokes it; the kernel then
# refuses the host.
step policy-tighten tighten_policy
step nvme-after-policy nvme_connect globex
step disconnect-after-policy disconnect
step finish-jobs sh -c "nvmegate --dev-dir $G --dev-identity acme-scheduler job finish vm-train-1 --reason done &&
  nvmegate --dev-dir $G --dev-identity globex-scheduler job finish vm-ckpt-1 --reason done"
step tree-after-finish tree
step nvme-after-finish nvme_connect globex
step disconnect-after-finish disconnect
step gateway-log sh -c "grep -c . /tmp/gateway.log; grep -ciE 'panic|DHHC-1' /tmp/gateway.log /tmp/agent.log /tmp/node.log /tmp/csi/ctrl.log /tmp/csi/node1.log /tmp/csi/node2.log || true"
