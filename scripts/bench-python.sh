#!/usr/bin/env bash
# rankmesh from Python against the same call from Rust and against mpi4py
# (issue #50), alternated, RUNS times: all_reduce of a float32 NumPy array in
# place at each size (Rust: `rankmesh bench`'s in-place column; mpi4py: the
# faster of its in-place and out-of-place Allreduce, at Open MPI's defaults
# and with vader's single copy off, the faster kept), and broadcast_object
# of a ~1 KiB dict against mpi4py's pickle bcast. Prints every run, then
# medians and ratios. Needs scripts/python-test.sh's environment, mpi4py in it
# (`target/python-venv/bin/pip install mpi4py`) and a release build.
# Usage: scripts/bench-python.sh [RUNS] [NP] [SIZES]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
np=${2:-2}
sizes=${3:-8,65536,1048576,16777216,67108864}
py=${RANKMESH_PY_VENV:-target/python-venv}/bin/python
bin=target/release/rankmesh
run() { bash scripts/mpirun-bench.sh -np "$np" "$@"; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  for s in ${sizes//,/ }; do
    run "$bin" bench all_reduce -b "$s" -e "$s" -w 20 -n "$(( s < 1048576 ? 20000 : 50 ))" \
      | awk -v s="$s" '$1 == s { print "rust " s " B: " $10 " us" }'
  done
  run "$py" python/bench/allreduce.py rankmesh "$sizes" | sed 's/^rankmesh/python/'
  run "$py" python/bench/allreduce.py mpi4py "$sizes"
  BASELINE=nocma run "$py" python/bench/allreduce.py mpi4py "$sizes" | sed 's/^mpi4py/mpi4py-nocma/'
  run "$py" python/bench/object_bcast.py 2000 5
  run "$py" scripts/pickle_bcast.py 2000 5
done | tee "$out"
python3 - "$out" <<'PY'
import re, statistics, sys
t = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (\d+) B: ([\d.]+) us", line)
    if m:
        t.setdefault((m[1], int(m[2])), []).append(float(m[3]))
    m = re.match(r"(rankmesh python broadcast_object|mpi4py pickle bcast)\D*?(?:\d+ B)?: ([\d.]+) us", line)
    if m:
        t.setdefault((m[1], 0), []).append(float(m[2]))
med = {k: statistics.median(v) for k, v in t.items()}
print("| bytes | Rust in place (us) | Python (us) | Python - Rust | mpi4py best (us) | mpi4py / Python |")
print("|---|---|---|---|---|---|")
for s in sorted({s for (w, s) in med if w == "python"}):
    rust, pyt = med.get(("rust", s)), med[("python", s)]
    m4 = min(v for k, v in med.items() if k[0].startswith("mpi4py") and k[1] == s)
    diff = f"{pyt - rust:+.2f} us ({pyt / rust:.2f}x)" if rust else "-"
    print(f"| {s} | {rust} | {pyt:.3f} | {diff} | {m4:.3f} | {m4 / pyt:.2f}x |")
o, p = med.get(("rankmesh python broadcast_object", 0)), med.get(("mpi4py pickle bcast", 0))
if o and p:
    print(f"broadcast_object of a ~1 KiB dict: rankmesh from Python {o:.2f} us, mpi4py pickle bcast {p:.2f} us ({p / o:.2f}x)")
PY
