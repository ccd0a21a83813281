#!/usr/bin/env bash
# rankmesh against raw MPI on a busy node: BUSY processes that spin (as a
# data-loader worker or a monitoring agent would) run beside NP ranks for
# each run. For each run, op and baseline setting (Open MPI's defaults, then
# vader's single copy off), `rankmesh bench OP --baseline mpi` once; the
# settings alternate. Prints, per op and size, rankmesh's median time, raw
# MPI's (the faster setting's median) and raw / rankmesh (above 1: rankmesh
# is faster). Ranks are placed by mpirun's defaults (scripts/mpirun-bench.sh).
# BUSY_PIN=1 pins busy process k to the k-th CPU this script may run on, as
# a co-located job or a hyperthread sibling holds one core each (unpinned,
# the kernel moves them between cores as it likes).
# Give each size a second or more of calls (-n): the scheduler shares a core
# in slices of milliseconds, and a shorter window samples stretches in which
# no rank was preempted (docs/BENCHMARKS.md, "Busy node").
# Usage: scripts/bench-busy.sh BUSY [NP] [RUNS] ["OP OP..."] [bench flags...]
#   e.g. scripts/bench-busy.sh 2 2 3 "all_reduce alltoall" -b 64K -e 64K -n 100000 -w 50
set -euo pipefail
busy=${1:?usage: $0 BUSY [NP] [RUNS] [\"OP OP...\"] [bench flags...]}
np=${2:-2}
runs=${3:-3}
ops=${4:-all_reduce}
shift $(( $# < 4 ? $# : 4 ))
bin=${RANKMESH_BIN:-target/release/rankmesh}
baselines=${BASELINES:-default nocma}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
# The CPUs this script may run on, in order ("0-3,8" -> 0 1 2 3 8).
cpus=()
IFS=, read -r -a spans <<< "$(taskset -cp $$ | sed 's/.*: //')"
for span in "${spans[@]}"; do cpus+=($(seq "${span%-*}" "${span#*-}")); done
hogs=()
stop_hogs() { for p in "${hogs[@]}"; do kill "$p" 2>/dev/null || true; done; hogs=(); }
trap 'stop_hogs; rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  for op in $ops; do
    for baseline in $baselines; do
      # Each busy process stops itself within 10 minutes if this script dies
      # (bash's SECONDS: the loop forks nothing).
      for k in $(seq 0 $((busy - 1))); do
        pin=()
        [[ "${BUSY_PIN:-0}" == 1 ]] && pin=(taskset -c "${cpus[k % ${#cpus[@]}]}")
        "${pin[@]}" bash -c 'while [ $SECONDS -lt 600 ]; do :; done' >/dev/null 2>&1 & hogs+=($!)
      done
      BASELINE=$baseline "$here/mpirun-bench.sh" -np "$np" "$bin" bench "$op" --baseline mpi "$@" \
        > "$tmp/out" 2>&1 || { stop_hogs; cat "$tmp/out"; exit 1; }
      stop_hogs
      # "# rankmesh --baseline" rows: size time busbw rawtime rawbusbw ratio +time
      awk -v op="$op" -v b="$baseline" '/^# +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ {print op, b, $2, $3, $5}' "$tmp/out" >> "$tmp/rows"
    done
  done
done
python3 - "$tmp/rows" "$runs" "$busy" "$np" <<'PY'
import os, sys, collections, statistics as st
rows, runs, busy, np = sys.argv[1:5]
rm, raw = collections.defaultdict(list), collections.defaultdict(list)
for line in open(rows):
    op, b, size, t, r = line.split()
    rm[(op, int(size))].append(float(t))
    raw[(op, int(size), b)].append(float(r))
pinned = " (pinned, one per CPU)" if os.environ.get("BUSY_PIN") == "1" else ""
print(f"# {busy} busy process(es){pinned} beside {np} ranks; {runs} runs per baseline setting, alternating; medians")
print(f"{'op':>14} {'size (B)':>10} {'rankmesh us':>12} {'raw us':>10} {'raw setting':>11} {'raw/rankmesh':>12}")
for op, size in sorted(rm, key=lambda k: (k[0], k[1])):
    t = st.median(rm[(op, size)])
    best = min((st.median(v), b) for (o, s, b), v in raw.items() if (o, s) == (op, size))
    print(f"{op:>14} {size:>10} {t:12.2f} {best[0]:10.2f} {best[1]:>11} {best[0] / t:12.2f}")
PY
