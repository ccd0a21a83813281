#!/usr/bin/env bash
# Several bench entries against raw MPI, alternated: for each run, `rankmesh
# bench OP --baseline mpi` once per OP in turn (each prints the raw MPI call
# on the same buffers beside it). Prints, per op and size, the median time,
# the median raw time and their ratio (raw / rankmesh: above 1 is faster),
# with each run's ratio. Raw MPI runs at Open MPI's defaults and with vader's
# single copy off (BASELINES, alternated); the faster setting's median is the
# baseline. Ranks are placed by mpirun's defaults (scripts/mpirun-bench.sh).
# Usage: scripts/bench-ops.sh "OP OP..." [RUNS] [NP] [bench flags...]
#   e.g. scripts/bench-ops.sh "alltoall alltoallv" 3 2 -b 1M -e 16M -f 16
set -euo pipefail
ops=${1:?usage: $0 \"OP OP...\" [RUNS] [NP] [bench flags...]}
runs=${2:-3}
np=${3:-2}
shift $(( $# < 3 ? $# : 3 ))
bin=${RANKMESH_BIN:-target/release/rankmesh}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  for op in $ops; do
    for baseline in ${BASELINES:-default nocma}; do
      BASELINE=$baseline "$here/mpirun-bench.sh" -np "$np" "$bin" bench "$op" --baseline mpi "$@" \
        > "$tmp/$op.$run.$baseline" 2>&1 || { cat "$tmp/$op.$run.$baseline"; exit 1; }
    done
  done
done
python3 - "$tmp" "$runs" $ops <<'PY'
import sys, statistics
tmp, runs, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
med = statistics.median
print(f"{'op':>14} {'size (B)':>10} {'us':>9} {'raw us':>9} {'ratio':>6}  runs' ratios ({runs} alternating runs, medians)")
import glob, collections
for op in ops:
    rows, raws = {}, collections.defaultdict(list)
    for path in sorted(glob.glob(f"{tmp}/{op}.*")):
        baseline = path.rsplit(".", 1)[1]
        on = False
        for line in open(path):
            if "raw time" in line: on = True; continue
            f = line.lstrip("#").split()
            if on and len(f) == 7 and f[0].isdigit():
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[3])))
                raws[(int(f[0]), baseline)].append(float(f[3]))
    for size in sorted(rows):
        # The faster baseline setting's median.
        t = med(a for a, _ in rows[size])
        raw = min(med(v) for (s, b), v in raws.items() if s == size)
        each = ", ".join(f"{b / a:.2f}" for a, b in rows[size])
        print(f"{op:>14} {size:>10} {t:>9.1f} {raw:>9.1f} {raw / t:>6.2f}  ({each})")
PY
