#!/usr/bin/env bash
# Runs an MPI job over N fake hosts on this machine: every host's ranks
# live in their own UTS namespace with their own host name, so the MPI sees
# N nodes (TCP between them, shared memory within one). The launcher is Open
# MPI's mpirun, or hydra's mpiexec (MPICH, Intel MPI), chosen as in
# scripts/mpirun-local.sh (RANKMESH_MPIEXEC, RANKMESH_MPI).
# Usage: scripts/fake-nodes.sh NODES RANKS_PER_NODE PROGRAM [ARGS...]
#        (RANKS_PER_NODE may be a comma list, one entry per node: 2,3)
#
# RANKMESH_FAKE_NET=1 also gives every fake node its own network namespace
# and address (10.77.N.1+i on a bridge, one veth pair per node), so Open MPI's
# TCP really crosses a link per node. RANKMESH_FAKE_SLOW=I:RATE rate-limits
# node I's link in both directions with a tbf qdisc (e.g. 1:20mbit; this
# kernel has tbf and htb, not netem); RANKMESH_FAKE_LINK=RATE limits every
# node's link so (e.g. 1gbit: a cluster's node links). Needs root;
# everything is removed on exit.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
nodes="$1" per_node="$2"
shift 2
launcher=${RANKMESH_MPIEXEC:-mpirun}
source "$here/launcher-lib.sh"
launcher_kind "$launcher"
hostfile="$(mktemp "${TMPDIR:-/tmp}/rankmesh-hosts.XXXXXX")"
IFS=, read -r -a counts <<< "$per_node"
total=0
for ((i = 0; i < nodes; i++)); do
  n="${counts[$i]:-${counts[0]}}"
  if [[ "$mpi" == openmpi ]]; then
    echo "rankmesh-node$i slots=$n" >> "$hostfile"
  else
    echo "rankmesh-node$i:$n" >> "$hostfile"
  fi
  total=$((total + n))
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
iface=lo
cleanup() { rm -f "$hostfile"; }
if [[ "${RANKMESH_FAKE_NET:-0}" == 1 ]]; then
  # A per-run tag keeps concurrent runs apart (interface names: 15 chars).
  tag=$(( $$ % 250 + 1 ))
  bridge="rmbr$tag"
  subnet="10.77.$tag"
  export RANKMESH_FAKE_NETNS_PREFIX="rm$tag-n"
  cleanup() {
    for ((i = 0; i < nodes; i++)); do
      ip netns del "rm$tag-n$i" 2>/dev/null || true
      ip link del "rm${tag}v$i" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
    rm -f "$hostfile"
  }
  trap cleanup EXIT
  ip link add "$bridge" type bridge
  ip addr add "$subnet.254/24" dev "$bridge"
  ip link set "$bridge" up
  for ((i = 0; i < nodes; i++)); do
    ns="rm$tag-n$i" outer="rm${tag}v$i" inner="rm${tag}p$i"
    ip netns add "$ns"
    ip link add "$outer" type veth peer name "$inner"
    ip link set "$outer" master "$bridge" up
    ip link set "$inner" netns "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$inner" name eth0
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  limit() { # node, rate
    tc qdisc add dev "rm${tag}v$1" root tbf rate "$2" burst 32kb latency 500ms
    ip netns exec "rm$tag-n$1" tc qdisc add dev eth0 root tbf rate "$2" burst 32kb latency 500ms
  }
  if [[ -n "${RANKMESH_FAKE_LINK:-}" ]]; then
    for ((i = 0; i < nodes; i++)); do limit "$i" "$RANKMESH_FAKE_LINK"; done
  fi
  if [[ -n "${RANKMESH_FAKE_SLOW:-}" ]]; then
    slow="${RANKMESH_FAKE_SLOW%%:*}"
    tc qdisc del dev "rm${tag}v$slow" root 2>/dev/null || true
    ip netns exec "rm$tag-n$slow" tc qdisc del dev eth0 root 2>/dev/null || true
    limit "$slow" "${RANKMESH_FAKE_SLOW#*:}"
  fi
  iface="$subnet.0/24" bridge_if=$bridge
else
  trap cleanup EXIT
fi
# Not exec: the trap must remove the namespaces after the job. The
# launcher runs in the background so that a TERM (timeout(1)) reaches it
# too: a launcher left behind keeps the fake hosts' processes running.
launch() {
  "$@" &
  local pid=$!
  # Open MPI's launcher wants a second signal to stop ("hit ctrl-c again").
  trap 'kill "$pid" 2>/dev/null; sleep 1; kill "$pid" 2>/dev/null; sleep 1; kill -9 "$pid" 2>/dev/null' TERM INT
  wait "$pid"
}
if [[ "$mpi" != openmpi ]]; then
  # hydra: one proxy per fake host, started through the agent as ssh
  # would be; the proxies call back on the loopback or the bridge.
  hydra_args "$@"
  [[ "$mpi" == impi ]] && export I_MPI_PIN=0
  # UCX (Debian's MPICH is ch4:ucx) sees one machine under the fake hosts
  # and would carry their traffic through shared memory: with their own
  # network, it goes over their links, as between real nodes.
  [[ -n "${bridge_if:-}" ]] && export UCX_TLS=${UCX_TLS:-self,tcp}
  launch "$launcher" -f "$hostfile" -launcher ssh -launcher-exec "$here/fake-node-agent.sh" \
    -iface "${bridge_if:-lo}" -n "$total" "${args[@]}"
  exit
fi
if ((ompi_4)); then
  local=(--mca plm_rsh_agent "$here/fake-node-agent.sh" --mca btl self,vader,tcp
         --mca oob_tcp_if_include "$iface" --mca btl_vader_single_copy_mechanism none)
else
  # 5.x: PRRTE starts the daemons (its ssh agent, its out-of-band channel,
  # which refuses loopback alone: RANKMESH_FAKE_NET=1), vader is sm, and
  # the wheel's one-sided UCX component errs without UCX devices.
  [[ "$iface" != lo ]] || { echo "fake-nodes: Open MPI 5 needs RANKMESH_FAKE_NET=1 (PRRTE refuses loopback)" >&2; exit 2; }
  export PRTE_MCA_prte_allow_run_as_root=1
  local=(--prtemca plm_ssh_agent "$here/fake-node-agent.sh" --prtemca oob_tcp_if_include "$iface"
         --mca btl self,sm,tcp --mca btl_sm_single_copy_mechanism none --mca osc ^ucx)
fi
launch "$launcher" -np "$total" --hostfile "$hostfile" --bind-to none --oversubscribe \
  --mca btl_tcp_if_include "$iface" "${local[@]}" "$@"
