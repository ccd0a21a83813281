#!/usr/bin/env bash
# rankmesh across fake nodes against raw MPI, alternated: builds the fake
# cluster of scripts/fake-nodes.sh (network namespaces, every node's link
# limited by a tbf qdisc) for each run, op and executor choice, runs
# `rankmesh bench OP --baseline mpi` (the raw MPI call on the same buffers
# beside it), and prints per op and size the median time of each choice,
# the median raw time and the ratios raw/choice (above 1: rankmesh is
# faster), with each run's ratio for the first choice. Needs root.
# Usage: scripts/bench-nodes.sh [RUNS] ["OP OP..."] [bench flags...]
#   NODES=2 PER_NODE=2 LINK=1gbit CHOICES="auto mpi" scripts/bench-nodes.sh 3 "all_reduce" -b 8 -e 16M -f 4 -n 10 -w 2
# CHOICES are RANKMESH_HOST_PLANE values (auto: the default a user gets;
# mpi: flat; hier: the node-aware stages at every size).
set -euo pipefail
runs=${1:-3}
ops=${2:-"all_reduce all_gather reduce_scatter"}
shift $(( $# < 2 ? $# : 2 ))
[ $# -gt 0 ] || set -- -b 8 -e 16M -f 8 -n 10 -w 2
nodes=${NODES:-2} per_node=${PER_NODE:-2} link=${LINK:-1gbit} choices=${CHOICES:-auto mpi}
bin=${RANKMESH_BIN:-target/release/rankmesh}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  for op in $ops; do
    for choice in $choices; do
      RANKMESH_FAKE_NET=1 RANKMESH_FAKE_LINK=$link "$here/fake-nodes.sh" "$nodes" "$per_node" \
        env RANKMESH_HOST_PLANE="$choice" "$bin" bench "$op" --baseline mpi "$@" > "$tmp/out" 2>&1 \
        || { cat "$tmp/out"; exit 1; }
      # "# rankmesh --baseline" rows: size time busbw rawtime rawbusbw ratio +time
      awk -v op="$op" -v c="$choice" -v r="$run" '/^# +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ {print op, c, r, $2, $3, $5}' "$tmp/out" >> "$tmp/rows"
      grep -m1 "^#  Host executor" "$tmp/out" | sed "s/^/$op $choice: /" >> "$tmp/executors" || true
    done
  done
done
echo "# $nodes fake nodes × $per_node ranks, every node link limited to $link (tbf), $runs alternating runs, medians"
sort -u "$tmp/executors" 2>/dev/null || true
python3 - "$tmp/rows" "$choices" <<'PY'
import sys, collections, statistics as st
rows, choices = sys.argv[1], sys.argv[2].split()
d = collections.defaultdict(list)
for line in open(rows):
    op, c, run, size, t, raw = line.split()
    d[(op, int(size), c)].append((float(t), float(raw)))
head = f"{'op':>14} {'size (B)':>10}" + "".join(f" {c + ' us':>11}" for c in choices)
head += f" {'raw us':>10}" + "".join(f" {'raw/' + c:>9}" for c in choices) + f"  runs' raw/{choices[0]}"
print(head)
for op, size in sorted({(k[0], k[1]) for k in d}):
    times = [st.median(x[0] for x in d[(op, size, c)]) for c in choices]
    raws = [x[1] for c in choices for x in d[(op, size, c)]]
    ratios = [st.median(x[1] / x[0] for x in d[(op, size, c)]) for c in choices]
    each = ", ".join(f"{x[1] / x[0]:.2f}" for x in d[(op, size, choices[0])])
    line = f"{op:>14} {size:>10}" + "".join(f" {t:11.1f}" for t in times)
    line += f" {st.median(raws):10.1f}" + "".join(f" {r:9.2f}" for r in ratios) + f"  ({each})"
    print(line)
PY
