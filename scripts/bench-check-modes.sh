#!/usr/bin/env bash
# Host time per device call in each check mode, against raw NCCL calls on the
# same communicator and buffers (`rankmesh bench --backend nccl --baseline
# nccl`), alternated: strict, deferred, off, strict, ... Prints, per size,
# the median of each mode's time and of its +time over the raw calls.
# Without a GPU it runs on the emulators (built from tests/emulator by the
# gpu test binary), synchronous (RANKMESH_EMU_ASYNC=0), with NCCL calls
# checked but moving nothing (RANKMESH_EMU_NCCL_SKIP=1): the times are the
# host time of a call, which is what a real GPU's asynchronous NCCL leaves
# the CPU. RANKMESH_EMU_NCCL_SKIP=0 includes the emulated transfer (an MPI
# exchange per call, which keeps the ranks in step and adds its noise).
# Usage: scripts/bench-check-modes.sh [RUNS] [NP] [bench flags...]
#   e.g. scripts/bench-check-modes.sh 3 2 -b 8 -e 4K -f 8 -n 20000 -w 1000
set -euo pipefail
runs=${1:-3}
np=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
cd "$(dirname "$0")/.."
bin=${RANKMESH_BIN:-target/release/rankmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [[ -z "${RANKMESH_NCCL_LIB:-}" ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  cargo build --release --bin rankmesh --test gpu >/dev/null
  gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -n1)
  RANKMESH_EMU_BUILD="$tmp/emu" "$gpu_test" >/dev/null
  export LD_LIBRARY_PATH="$tmp/emu" RANKMESH_NCCL_LIB="$tmp/emu/libnccl.so.2"
  export RANKMESH_EMU_ASYNC=0 RANKMESH_EMU_GPUS=$np
  export RANKMESH_EMU_NCCL_SKIP=${RANKMESH_EMU_NCCL_SKIP:-1}
  # Nothing moves, so there is nothing to validate.
  [[ $RANKMESH_EMU_NCCL_SKIP == 1 ]] && set -- "$@" -c 0
fi
for run in $(seq "$runs"); do
  for mode in strict deferred off; do
    RANKMESH_CHECK=$mode scripts/mpirun-local.sh -np "$np" \
      -x LD_LIBRARY_PATH -x RANKMESH_NCCL_LIB -x RANKMESH_EMU_ASYNC -x RANKMESH_EMU_GPUS -x RANKMESH_EMU_NCCL_SKIP -x RANKMESH_CHECK \
      "$bin" bench all_reduce --backend nccl --baseline nccl "$@" > "$tmp/$mode.$run" 2>&1 \
      || { cat "$tmp/$mode.$run"; exit 1; }
  done
done
python3 - "$tmp" "$runs" <<'PY'
import sys, statistics
tmp, runs = sys.argv[1], int(sys.argv[2])
def table(mode):
    # "# rankmesh --baseline" rows: size time busbw rawtime rawbusbw ratio +time
    rows = {}
    for r in range(1, runs + 1):
        on = False
        for line in open(f"{tmp}/{mode}.{r}"):
            if "raw time" in line: on = True; continue
            f = line.lstrip("#").split()
            if on and len(f) == 7 and f[0].isdigit():
                rows.setdefault(int(f[0]), []).append((float(f[1]), float(f[6])))
    return rows
modes = ["strict", "deferred", "off"]
t = {m: table(m) for m in modes}
med = statistics.median
print(f"{'size (B)':>10}" + "".join(f" {m + ' us':>12} {'+time':>8}" for m in modes) + f"  ({runs} alternating runs, medians)")
for size in sorted(t["strict"]):
    print(f"{size:>10}" + "".join(f" {med(a for a, _ in t[m][size]):>12.2f} {med(p for _, p in t[m][size]):>8.2f}" for m in modes))
PY
