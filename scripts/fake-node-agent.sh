#!/usr/bin/env bash
# rsh agent for Open MPI (--mca plm_rsh_agent) and hydra (-launcher ssh
# -launcher-exec): "logs in" to a fake host by
# running the daemon command in a new UTS namespace whose host name is that
# host (and, with fake-nodes.sh's RANKMESH_FAKE_NET, inside that host's own
# network namespace). Like ssh, it runs the command line it is given through
# a shell.
set -euo pipefail
# hydra's ssh launcher (-launcher-exec) passes ssh's -x before the host.
[[ "${1:-}" == -x ]] && shift
host="$1"
shift
netns=()
if [[ -n "${RANKMESH_FAKE_NETNS_PREFIX:-}" ]]; then
  netns=(ip netns exec "${RANKMESH_FAKE_NETNS_PREFIX}${host#rankmesh-node}")
fi
exec "${netns[@]}" unshare --uts /bin/sh -c 'hostname "$1" && eval "$2"' fake-node-agent "$host" "$*"
