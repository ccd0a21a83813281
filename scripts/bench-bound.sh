#!/usr/bin/env bash
# The shared-memory executor and raw MPI against this machine's memory bound,
# alternated: each run times examples/memory_bound (the ideal single-copy
# pattern of OP, two pinned processes, every buffer shared) and then
# `rankmesh bench OP --baseline mpi` on the shared-memory executor, ranks
# bound to cores. Prints the medians and how far each is from the bound.
# Usage: scripts/bench-bound.sh OP SIZE [RUNS]   (OP: all_reduce, all_gather,
#        broadcast, reduce_scatter, all_to_all; SIZE in bytes or with K/M)
set -euo pipefail
op=${1:?usage: $0 OP SIZE [RUNS]}
size=${2:?usage: $0 OP SIZE [RUNS]}
runs=${3:-3}
bin=${RANKMESH_BIN:-target/release/rankmesh}
bound=${RANKMESH_BOUND_BIN:-target/release/examples/memory_bound}
for f in "$bin" "$bound"; do
  [ -x "$f" ] || { echo "$0: $f is missing: cargo build --release --bin rankmesh --example memory_bound" >&2; exit 1; }
done
bytes=$(python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$size")
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for run in $(seq "$runs"); do
  "$bound" "$bytes" 20 > "$tmp/bound.$run"
  RANKMESH_MPIRUN_BIND=core RANKMESH_HOST_PLANE=shm "$here/mpirun-bench.sh" -np 2 "$bin" bench "$op" \
    -b "$bytes" -e "$bytes" -n 20 -w 3 --baseline mpi > "$tmp/bench.$run" 2>&1
done
python3 - "$tmp" "$runs" "$op" "$bytes" <<'PY'
import sys, statistics
tmp, runs, op, size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
bound, shm, raw, one_core = [], [], [], []
for r in range(1, runs + 1):
    for line in open(f"{tmp}/bound.{r}"):
        f = line.split()
        if len(f) > 2 and f[1] == "us" and f[2] == op:
            bound.append(float(f[0]))
        if "memcpy N, one core" in line:
            one_core.append(float(f[0]))
    for line in open(f"{tmp}/bench.{r}"):
        f = line.lstrip("#").split()
        if len(f) == 7 and f[0] == str(size):
            shm.append(float(f[1])); raw.append(float(f[3]))
if not (bound and shm):
    sys.exit(f"no {op} figures at {size} bytes (is OP one of the five?)")
med = statistics.median
b, s, m = med(bound), med(shm), med(raw)
print(f"{op} {size} B, {runs} alternating runs (medians, us): bound {b:.1f}  shm {s:.1f}  raw MPI {m:.1f}")
print(f"  shm / bound {s / b:.2f}   raw / bound {m / b:.2f}   raw / shm {m / s:.2f}")
if op == "broadcast":
    # Without a single-copy mechanism only the root can read its private
    # input: one core reading N is then the floor, not the bound's two.
    c = med(one_core)
    print(f"  one core copying N (the floor when only the root reads its input): {c:.1f}   shm / that {s / c:.2f}   raw / that {m / c:.2f}")
print(f"  per run: bound {' '.join(f'{x:.0f}' for x in bound)}; shm {' '.join(f'{x:.0f}' for x in shm)}; raw {' '.join(f'{x:.0f}' for x in raw)}")
PY
