#!/usr/bin/env bash
# SPIRE registration entries for nvmegate (DESIGN §3 names the paths). Each
# workload gets its own SVID through selectors that only it matches; run on
# the SPIRE server with a trust domain and the parent IDs of your agents.
#
#   TD=example.org K8S_AGENT=spiffe://example.org/spire/agent/k8s_psat/prod/... \
#     deploy/spire/entries.sh
#
# Storage servers, GPU nodes and operator hosts attest with their own node
# attestor (x509pop, tpm_devid, ...); their agents' IDs are given per host.
set -euo pipefail
TD="${TD:?trust domain, e.g. example.org}"
entry() { spire-server entry create "$@"; }

# The gateway: the nvmegated service account in the nvmegate namespace.
entry -parentID "${K8S_AGENT:?the SPIRE agent ID of the gateway cluster}" \
  -spiffeID "spiffe://$TD/gateway/nvmegated" \
  -selector k8s:ns:nvmegate -selector k8s:sa:nvmegated \
  -x509SVIDTTL 3600

# Each storage server's target agent: the nvmegate-target systemd unit.
# TARGETS="stor-eu-1=spiffe://$TD/spire/agent/x509pop/<fingerprint> ..."
for t in ${TARGETS:-}; do
  entry -parentID "${t#*=}" -spiffeID "spiffe://$TD/target/${t%%=*}" \
    -selector systemd:id:nvmegate-target.service -x509SVIDTTL 3600
done

# Each GPU node's agent (the process that calls Connect and runs nvme
# connect): one SVID per host, bound in the inventory to one host NQN.
# NODES="gpu-0001=spiffe://$TD/spire/agent/tpm_devid/<id> ..."
for n in ${NODES:-}; do
  entry -parentID "${n#*=}" -spiffeID "spiffe://$TD/node/${n%%=*}" \
    -selector systemd:id:nvmegate-node.service -x509SVIDTTL 3600
done

# Training schedulers, one per tenant: TENANT_SCHEDULERS="acme=<agent ID> ...".
for s in ${TENANT_SCHEDULERS:-}; do
  entry -parentID "${s#*=}" -spiffeID "spiffe://$TD/tenant/${s%%=*}/scheduler/slurm" \
    -selector unix:user:slurm -x509SVIDTTL 3600
done

# Security admins and auditors on their workstations' agents, by user.
for a in ${ADMINS:-}; do        # "alice=<agent ID>"
  entry -parentID "${a#*=}" -spiffeID "spiffe://$TD/admin/${a%%=*}" -selector "unix:user:${a%%=*}" -x509SVIDTTL 900
done
for a in ${AUDITORS:-}; do      # "bob=<agent ID>"
  entry -parentID "${a#*=}" -spiffeID "spiffe://$TD/auditor/${a%%=*}" -selector "unix:user:${a%%=*}" -x509SVIDTTL 900
done
