#!/usr/bin/env bash
# rankmesh against each MPI's own raw calls, each MPI at its default
# settings, on 2 ranks: all_reduce, alltoall and broadcast at 8 B, 1 MiB and
# 64 MiB. rankmesh is built against each (as scripts/mpi-smoke.sh builds
# it: target/mpi-NAME; target/release for Debian's Open MPI) and started by
# that MPI's launcher through scripts/mpirun-bench.sh: nothing set but what
# this machine needs (root allowed, loopback). all_to_all's smallest size is
# 32 B (on 2 ranks it moves nothing per rank below that). Runs alternate between the MPIs; prints, per MPI, op
# and size, rankmesh's median time, raw MPI's and raw / rankmesh (above 1:
# rankmesh is faster).
# Usage: scripts/bench-mpis.sh [RUNS] [MPI...]
#   MPI: openmpi4 (Debian), mpich (Debian), openmpi5, mpich5, impi (PyPI)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
shift || true
mpis=("$@")
((${#mpis[@]})) || mpis=(openmpi4 mpich openmpi5 mpich5 impi)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RANKMESH_LOG=error
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
launch() {  # MPI PROGRAM ARGS...: 2 ranks at the MPI's defaults (scripts/mpirun-bench.sh)
    local mpi=$1 exe=mpirun
    shift
    case "$mpi" in
        mpich) exe=mpiexec.mpich ;;
        openmpi5 | mpich5 | impi) exe=.cache/mpi/$mpi/bin/mpiexec ;;
    esac
    RANKMESH_MPIEXEC=$exe I_MPI_ROOT=$PWD/.cache/mpi/impi bash scripts/mpirun-bench.sh -np 2 "$@"
}
bin_of() {  # MPI: rankmesh built against it
    if [[ "$1" == openmpi4 ]]; then echo target/release/rankmesh; else echo "target/mpi-$1/release/rankmesh"; fi
}
for mpi in "${mpis[@]}"; do
    bin=$(bin_of "$mpi")
    if [[ "$mpi" == openmpi4 ]]; then
        cargo build --release --bin rankmesh -q
    elif [[ ! -x "$bin" ]]; then
        echo "bench-mpis: $bin missing: run scripts/mpi-smoke.sh $mpi first" >&2
        exit 1
    fi
done
for run in $(seq "$runs"); do
    for mpi in "${mpis[@]}"; do
        bin=$(bin_of "$mpi")
        for op in all_reduce alltoall broadcast; do
            # all_to_all moves nothing per rank below 32 B on 2 ranks.
            small="-b 8 -e 8"
            [[ "$op" == alltoall ]] && small="-b 32 -e 32"
            for sizes in "$small -n 20000 -w 1000" "-b 1M -e 64M -f 64 -n 20 -w 3"; do
                # shellcheck disable=SC2086
                launch "$mpi" "$bin" bench "$op" --baseline mpi $sizes > "$tmp/out" 2>&1 \
                    || { cat "$tmp/out"; exit 1; }
                awk -v m="$mpi" -v op="$op" '/^# +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ {print m, op, $2, $3, $5}' \
                    "$tmp/out" >> "$tmp/rows"
            done
        done
    done
done
python3 - "$tmp/rows" "$runs" <<'PY'
import sys, collections, statistics as st
rows, runs = sys.argv[1:3]
rm, raw = collections.defaultdict(list), collections.defaultdict(list)
for line in open(rows):
    m, op, size, t, r = line.split()
    rm[(m, op, int(size))].append(float(t))
    raw[(m, op, int(size))].append(float(r))
print(f"# 2 ranks, each MPI at its defaults; {runs} runs, alternating; medians")
print(f"{'mpi':>9} {'op':>11} {'size (B)':>10} {'rankmesh us':>12} {'raw us':>10} {'raw/rankmesh':>12}")
for k in sorted(rm):
    t, r = st.median(rm[k]), st.median(raw[k])
    print(f"{k[0]:>9} {k[1]:>11} {k[2]:>10} {t:12.2f} {r:10.2f} {r / t:12.2f}")
PY
