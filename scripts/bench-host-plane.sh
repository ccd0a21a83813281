#!/usr/bin/env bash
# Host executors against raw MPI, alternated: for each run, `rankmesh bench OP
# --baseline mpi` once on the shared-memory executor and once on the MPI
# executor (both print the raw MPI call on the same buffers beside them).
# Prints, per size, the median time of each and the bus-bandwidth ratios.
# MPI runs at its default settings (scripts/mpirun-bench.sh; Open MPI binds
# 2-rank jobs to cores by default); BASELINE=nocma runs the raw baseline with
# vader's single copy off instead (compare with the faster of the two).
# Usage: scripts/bench-host-plane.sh OP [RUNS] [NP] [bench flags...]
#   e.g. scripts/bench-host-plane.sh all_reduce 3 2 -b 8 -e 64M -f 8
set -euo pipefail
op=${1:?usage: $0 OP [RUNS] [NP] [bench flags...]}
runs=${2:-3}
np=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
bin=${RANKMESH_BIN:-target/release/rankmesh}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  for plane in shm mpi; do
    RANKMESH_HOST_PLANE=$plane "$here/mpirun-bench.sh" -np "$np" "$bin" bench "$op" --baseline mpi "$@" \
      > "$tmp/$plane.$run" 2>&1
  done
done
python3 - "$tmp" "$runs" <<'PY'
import sys, statistics, glob
tmp, runs = sys.argv[1], int(sys.argv[2])
def table(plane):
    # "# rankmesh --baseline" rows: size time busbw rawtime rawbusbw ratio +time
    rows = {}
    for r in range(1, runs + 1):
        on = False
        for line in open(f"{tmp}/{plane}.{r}"):
            if "raw time" in line: on = True; continue
            f = line.lstrip("#").split()
            if on and len(f) == 7 and f[0].isdigit():
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[3])))
    return rows
shm, mpi = table("shm"), table("mpi")
med = statistics.median
print(f"{'size (B)':>10} {'shm us':>10} {'mpi us':>10} {'raw us':>10} {'shm/raw bw':>11} {'mpi/raw bw':>11}  ({runs} alternating runs, medians)")
for size in sorted(shm):
    s = med(t for t, _ in shm[size]); m = med(t for t, _ in mpi[size])
    raw = med([r for _, r in shm[size]] + [r for _, r in mpi[size]])
    print(f"{size:>10} {s:>10.2f} {m:>10.2f} {raw:>10.2f} {raw/s:>11.2f} {raw/m:>11.2f}")
PY
