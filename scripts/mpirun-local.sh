#!/usr/bin/env bash
# Runs an Open MPI job on this machine only: loopback TCP and shared memory,
# oversubscription allowed (more ranks than cores), no core binding (set
# RANKMESH_MPIRUN_BIND=core to let mpirun bind), and idle ranks yield the CPU
# so oversubscribed jobs do not spin each other out.
# vader's single copy is off here for the tests; benchmarks and the demo
# use scripts/mpirun-bench.sh, so no raw-MPI baseline inherits it.
# Usage: scripts/mpirun-local.sh -np N PROGRAM [ARGS...]
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1
# Each job keeps Open MPI's session directory under a base of its own: two
# jobs started at once (tests/two_jobs.rs, the GPU emulator's two-job trials)
# otherwise race to create the shared /tmp/ompi.<host>.<uid>, and the loser
# fails in orte_init ("A call to mkdir ... File exists"). Bases left empty
# by earlier jobs are pruned.
sessions=${TMPDIR:-/tmp}/rankmesh-mpirun
mkdir -p "$sessions"
find "$sessions" -mindepth 1 -maxdepth 1 -type d -empty -mmin +5 -delete 2>/dev/null || true
OMPI_MCA_orte_tmpdir_base=$(mktemp -d "$sessions/job.XXXXXX")
export OMPI_MCA_orte_tmpdir_base
exec mpirun --oversubscribe --bind-to "${RANKMESH_MPIRUN_BIND:-none}" \
  --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  --mca btl_vader_single_copy_mechanism none \
  "$@"
