#!/usr/bin/env bash
# torch.distributed on "rankmesh" against "gloo" at its defaults (issue #68):
# the same program (python/bench/torch_ops.py), alternated RUNS times at
# each world size, all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
# all_to_all_single and broadcast of float32 CPU tensors at 8 B-64 MiB; in
# each run also torch's dispatch floor (its fake backend, one process per
# rank, launched as the job is, so that ranks sharing a core share it) and
# the package's own all_reduce of 8 B on a NumPy array and on a torch
# tensor. Prints every run, then medians and gloo / rankmesh ratios.
# Needs scripts/python-test.sh's environment (torch in its venv).
# Usage: scripts/bench-torch.sh [RUNS] [NPS]     (defaults: 3 "2 4")
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
nps=${2:-2 4}
py=${RANKMESH_PY_VENV:-target/python-venv}/bin/python
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$runs"); do
  for np in $nps; do
    timeout 300 bash scripts/mpirun-bench.sh -np "$np" "$py" python/bench/torch_ops.py fake "$np"
    for backend in rankmesh gloo; do
      timeout 900 bash scripts/mpirun-bench.sh -np "$np" "$py" python/bench/torch_ops.py "$backend"
    done
  done
done | tee "$out"
python3 - "$out" <<'PY'
import json, statistics, sys
t = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        t.setdefault((r["np"], r["op"], r["bytes"], r["backend"]), []).append(r["us"])
med = {k: statistics.median(v) for k, v in t.items()}
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"
print("\n| np | op | size | rankmesh µs | gloo µs | gloo / rankmesh |")
print("|---|---|---|---|---|---|")
for (np_, op, b, be), us in sorted(med.items()):
    if be == "rankmesh" and (np_, op, b, "gloo") in med:
        g = med[(np_, op, b, "gloo")]
        print(f"| {np_} | {op} | {size(b)} | {us:.1f} | {g:.1f} | {g / us:.1f}x |")
print("\n| np | 8 B all_reduce | µs (median of runs) |")
print("|---|---|---|")
for np_ in sorted({k[0] for k in med}):
    for be in ("fake", "package_numpy", "package_torch", "rankmesh"):
        if (np_, "all_reduce", 8, be) in med:
            print(f"| {np_} | {be} | {med[(np_, 'all_reduce', 8, be)]:.2f} |")
    floor = med.get((np_, "all_reduce", 8, "fake"))
    numpy = med.get((np_, "all_reduce", 8, "package_numpy"))
    if floor is not None and numpy is not None:
        print(f"| {np_} | target: floor + package + 2 | {floor + numpy + 2:.2f} |")
PY
