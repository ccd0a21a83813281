#!/usr/bin/env bash
# Two rankmesh builds against each other and against raw MPI, alternated:
# for each run and op, `rankmesh bench OP --baseline mpi` once with BASE and
# once with NEW. Prints, per op and size, the median times, BASE/NEW (above
# 1: NEW is faster) and each build's median ratio to raw MPI (raw time /
# rankmesh time). Raw MPI runs at Open MPI's defaults and with vader's single
# copy off (BASELINES, alternated); the faster setting's median is the
# baseline. Ranks are placed by mpirun's defaults (scripts/mpirun-bench.sh).
# The last column compares each build's fastest run: on a VM whose runs are
# bimodal (the same call 2x slower in some runs), minima compare code where
# medians of a few runs compare luck.
# Usage: scripts/bench-ab.sh BASE NEW "OP OP..." [RUNS] [NP] [bench flags...]
#   e.g. scripts/bench-ab.sh /tmp/rankmesh-main target/release/rankmesh "alltoall" 3 2 -b 16K -e 64M -f 4
set -euo pipefail
base=${1:?usage: $0 BASE NEW \"OP OP...\" [RUNS] [NP] [bench flags...]}
new=${2:?usage: $0 BASE NEW \"OP OP...\" [RUNS] [NP] [bench flags...]}
ops=${3:?usage: $0 BASE NEW \"OP OP...\" [RUNS] [NP] [bench flags...]}
runs=${4:-3}
np=${5:-2}
shift $(( $# < 5 ? $# : 5 ))
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  for op in $ops; do
    for baseline in ${BASELINES:-default nocma}; do
      for side in base new; do
        bin=$base; [ "$side" = new ] && bin=$new
        BASELINE=$baseline "$here/mpirun-bench.sh" -np "$np" "$bin" bench "$op" --baseline mpi "$@" \
          > "$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
        # "# rankmesh --baseline" rows: size time busbw rawtime rawbusbw ratio +time
        awk -v op="$op" -v side="$side" -v b="$baseline" '/^# +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ {print op, side, $2, $3, $5, b}' "$tmp/out" >> "$tmp/rows"
      done
    done
  done
done
python3 - "$tmp/rows" "$runs" <<'PY'
import sys, collections, statistics as st
rows, runs = sys.argv[1], sys.argv[2]
d = collections.defaultdict(list)
raws = collections.defaultdict(list)
for line in open(rows):
    op, side, size, t, raw, baseline = line.split()
    d[(op, int(size), side)].append(float(t))
    raws[(op, int(size), baseline)].append(float(raw))
def raw_of(op, size):
    # The faster baseline setting's median.
    return min(st.median(v) for (o, s, b), v in raws.items() if (o, s) == (op, size))
print(f"{'op':>14} {'size (B)':>10} {'base us':>9} {'new us':>9} {'base/new':>8} {'raw/base':>8} {'raw/new':>8} {'min b/n':>8}  ({runs} alternating runs, medians; min b/n: of each side's fastest run)")
for op, size in sorted({(k[0], k[1]) for k in d}, key=lambda k: (k[0], k[1])):
    b, n = d[(op, size, "base")], d[(op, size, "new")]
    bt, nt, raw = st.median(b), st.median(n), raw_of(op, size)
    rb, rn = raw / bt, raw / nt
    print(f"{op:>14} {size:>10} {bt:9.1f} {nt:9.1f} {bt / nt:8.2f} {rb:8.2f} {rn:8.2f} {min(b) / min(n):8.2f}")
PY
