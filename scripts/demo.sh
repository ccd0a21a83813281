#!/usr/bin/env bash
# The main job on this machine: installs missing system packages (Debian/Ubuntu),
# builds rankmesh, and on 4 local MPI ranks (CPU only) shows the topology with
# TP=2/SP=2 groups, then runs a short all_reduce sweep against raw MPI.
# With arguments, runs `rankmesh ARGS...` on the ranks instead, e.g.
# `scripts/demo.sh topo --tp 4 --json` or `scripts/demo.sh bench all_gather -b 1K -e 1M -f 4`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release --quiet --bin rankmesh
ranks="${RANKMESH_DEMO_RANKS:-4}"
# MPI at its default settings: the sweep's raw-MPI column is Open MPI as a
# user runs it (scripts/mpirun-bench.sh adds only what this machine needs).
run() { bash scripts/mpirun-bench.sh -np "$ranks" target/release/rankmesh "$@"; }
if [ $# -gt 0 ]; then
  run "$@"
else
  run topo --tp 2 --sp 2
  echo
  run bench all_reduce -b 8 -e 1M -f 8 -n 20 -w 5 --baseline mpi
fi
