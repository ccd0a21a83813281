#!/usr/bin/env bash
# broadcast_object of a ~1 KiB struct against mpi4py's pickle bcast of the
# same value, alternated: each run times examples/object_bench on the
# shared-memory and on the MPI executor, then scripts/pickle_bcast.py.
# Prints every run and, per line, the median and the speedup over pickle.
# Usage: scripts/bench-object.sh [RUNS] [NP]   (needs mpi4py: python3-mpi4py)
set -euo pipefail
runs=${1:-3}
np=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
py=${RANKMESH_PYTHON:-/usr/bin/python3}
bin=${RANKMESH_OBJECT_BENCH:-target/release/examples/object_bench}
"$py" -c 'import mpi4py' 2>/dev/null || {
  echo "bench-object: $py cannot import mpi4py (apt-get install python3-mpi4py, or set RANKMESH_PYTHON)" >&2
  exit 1
}
[ -x "$bin" ] || {
  echo "bench-object: $bin not built (cargo build --release --example object_bench)" >&2
  exit 1
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  for plane in shm mpi; do
    RANKMESH_HOST_PLANE=$plane "$here/mpirun-bench.sh" -np "$np" "$bin" 2000 5 | sed "s/^/$plane /"
  done
  "$here/mpirun-bench.sh" -np "$np" "$py" "$here/pickle_bcast.py" 2000 5 | sed "s/^/- /"
done | tee "$out"
python3 - "$out" <<'PY'
import re, statistics, sys
times = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (.*?) \d+ B: ([\d.]+) us", line)
    if m:
        times.setdefault(f"{m[1]} {m[2]}", []).append(float(m[3]))
pickle = statistics.median(times.pop("- mpi4py pickle bcast"))
print(f"median mpi4py pickle bcast: {pickle:.2f} us")
for name, ts in times.items():
    t = statistics.median(ts)
    print(f"median {name}: {t:.2f} us, {pickle / t:.1f}x faster than pickle")
PY
