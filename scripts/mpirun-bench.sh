#!/usr/bin/env bash
# Runs an Open MPI job on this machine for a benchmark, with the MPI library
# at its default settings: only what this machine needs to run at all is set
# (root allowed, loopback as the only network, --oversubscribe when the ranks
# outnumber the cores). Raw-MPI baselines measured through it are at MPI's
# defaults; scripts/mpirun-local.sh keeps the settings the tests need and is
# not for baselines.
# BASELINE=nocma adds one tuned setting (vader's single copy off, faster for
# some ops here): benchmark scripts run both and compare with the faster raw.
# RANKMESH_MPIRUN_BIND=core|none overrides mpirun's default binding.
# RANKMESH_MPIEXEC and RANKMESH_MPI pick the launcher as for
# scripts/mpirun-local.sh; hydra (MPICH, Intel MPI) gets nothing but the
# ranks (`-np N` is `-n N`, `-x VAR=VALUE` is `-env VAR VALUE`).
# Usage: scripts/mpirun-bench.sh -np N PROGRAM [ARGS...]
set -euo pipefail
launcher=${RANKMESH_MPIEXEC:-mpirun}
source "$(dirname "$0")/launcher-lib.sh"
launcher_kind "$launcher"
if [[ "$mpi" != openmpi ]]; then
    hydra_args "$@"
    exec "$launcher" "${args[@]}"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--mca btl_tcp_if_include lo)
shm=vader
if ((ompi_4)); then
    args+=(--mca oob_tcp_if_include lo)
else
    shm=sm  # Open MPI 5: vader is sm; PRRTE's out-of-band refuses loopback alone
fi
np=0
[ "${1:-}" = "-np" ] && np=${2:-0}
[ "$np" -gt "$(nproc)" ] && args+=(--oversubscribe)
[ -n "${RANKMESH_MPIRUN_BIND:-}" ] && args+=(--bind-to "$RANKMESH_MPIRUN_BIND")
case "${BASELINE:-default}" in
  default) ;;
  nocma) args+=(--mca "btl_${shm}_single_copy_mechanism" none) ;;
  *) echo "mpirun-bench: BASELINE=$BASELINE: use default or nocma" >&2; exit 2 ;;
esac
exec "$launcher" "${args[@]}" "$@"
