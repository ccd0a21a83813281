#!/usr/bin/env bash
# rsh agent for Open MPI (--mca plm_rsh_agent): "logs in" to a fake host by
# running the daemon command in a new UTS namespace whose host name is that
# host. Like ssh, it runs the command line it is given through a shell.
set -euo pipefail
host="$1"
shift
exec unshare --uts /bin/sh -c 'hostname "$1" && eval "$2"' fake-node-agent "$host" "$*"
