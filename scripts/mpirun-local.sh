#!/usr/bin/env bash
# Runs an MPI job on this machine only: loopback and shared memory,
# oversubscription allowed (more ranks than cores), no core binding (set
# RANKMESH_MPIRUN_BIND=core to let the launcher bind), and idle ranks yield
# the CPU so oversubscribed jobs do not spin each other out.
#
# The one launcher layer of the tests and scripts. It takes Open MPI's
# spelling (`-np N`, `-x VAR` to forward, `-x VAR=VALUE` to set, `:` between
# the parts of an MPMD job) and speaks each MPI's own:
#   RANKMESH_MPIEXEC  the launcher to run (default: mpirun on PATH)
#   RANKMESH_MPI      openmpi | mpich | impi (default: asked of the launcher's
#                     --version); mpich and impi start through hydra.
# Open MPI: vader's (4.x) or sm's (5.x) single copy is off here for the
# tests; benchmarks and the demo use scripts/mpirun-bench.sh, so no raw-MPI
# baseline inherits it.
# Usage: scripts/mpirun-local.sh -np N PROGRAM [ARGS...] [: -np N PROGRAM ...]
set -euo pipefail
launcher=${RANKMESH_MPIEXEC:-mpirun}
source "$(dirname "$0")/launcher-lib.sh"
launcher_kind "$launcher"
bind=${RANKMESH_MPIRUN_BIND:-none}

case "$mpi" in
openmpi)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_mpi_yield_when_idle=1
    # Each job keeps Open MPI's session directory under a base of its own:
    # two jobs started at once (tests/two_jobs.rs, the GPU emulator's
    # two-job trials) otherwise race to create the shared
    # /tmp/ompi.<host>.<uid>, and the loser fails in orte_init ("A call to
    # mkdir ... File exists"). Bases left empty by earlier jobs are pruned.
    sessions=${TMPDIR:-/tmp}/rankmesh-mpirun
    mkdir -p "$sessions"
    find "$sessions" -mindepth 1 -maxdepth 1 -type d -empty -mmin +5 -delete 2>/dev/null || true
    base=$(mktemp -d "$sessions/job.XXXXXX")
    export OMPI_MCA_orte_tmpdir_base=$base PRTE_MCA_prte_tmpdir_base=$base
    if ((ompi_4)); then
        local=(--mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none
               --mca oob_tcp_if_include lo)
    else
        # 5.x: vader is sm, and PRRTE's out-of-band channel, which refuses
        # loopback alone, stays on the host. The one-sided UCX component of
        # the PyPI wheel prints errors on a machine without UCX devices.
        local=(--mca btl self,sm,tcp --mca btl_sm_single_copy_mechanism none --mca osc ^ucx)
    fi
    exec "$launcher" --oversubscribe --bind-to "$bind" --mca btl_tcp_if_include lo "${local[@]}" "$@"
    ;;
mpich | impi)
    hydra_args "$@"
    if [[ "$mpi" == impi ]]; then
        # Intel MPI pins each rank to a core unless told otherwise.
        if [[ "$bind" == none ]]; then export I_MPI_PIN=0; else export I_MPI_PIN=1; fi
        export I_MPI_FABRICS=shm
        exec "$launcher" "${args[@]}"
    fi
    binding=()
    [[ "$bind" == none ]] || binding=(-bind-to "$bind")
    exec "$launcher" -iface lo "${binding[@]}" "${args[@]}"
    ;;
*)
    echo "mpirun-local: RANKMESH_MPI=$mpi is not openmpi, mpich or impi" >&2
    exit 2
    ;;
esac
