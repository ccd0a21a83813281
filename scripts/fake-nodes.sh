#!/usr/bin/env bash
# Runs an Open MPI job over N fake hosts on this machine: every host's ranks
# live in their own UTS namespace with their own host name, so Open MPI sees
# N nodes (TCP on loopback between them, shared memory within one).
# Usage: scripts/fake-nodes.sh NODES RANKS_PER_NODE PROGRAM [ARGS...]
#        (RANKS_PER_NODE may be a comma list, one entry per node: 2,3)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nodes="$1" per_node="$2"
shift 2
hostfile="$(mktemp "${TMPDIR:-/tmp}/rankmesh-hosts.XXXXXX")"
trap 'rm -f "$hostfile"' EXIT
IFS=, read -r -a counts <<< "$per_node"
total=0
for ((i = 0; i < nodes; i++)); do
  n="${counts[$i]:-${counts[0]}}"
  echo "rankmesh-node$i slots=$n" >> "$hostfile"
  total=$((total + n))
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
mpirun -np "$total" --hostfile "$hostfile" --bind-to none --oversubscribe \
  --mca plm_rsh_agent "$here/fake-node-agent.sh" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  --mca btl_vader_single_copy_mechanism none \
  "$@"
