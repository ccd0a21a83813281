#!/usr/bin/env bash
# rankmesh built against one MPI and run under that MPI's own launcher
# (through scripts/mpirun-local.sh, the launcher layer): what a user of a
# cluster with that MPI meets first. The whole suite runs under Open MPI 4
# (Debian); this is the portability smoke of issue #49. Checks, each a line:
# the build links the MPI its headers came from; topo on 1-4 ranks and two
# layouts; every host op validated at np 2 and 3; a mismatched call named on
# every rank; a rank that never starts, named or said to be unnameable; the
# build started by another MPI's launcher, refused; the watchdog naming a
# stopped rank; doctor; the self-checking workload; and a
# library of the other MPI family refused before MPI_Init. Exits non-zero at
# the first failure.
# Usage: scripts/mpi-smoke.sh MPI
#   mpich     Debian's MPICH 4 (apt-get install mpich libmpich-dev)
#   openmpi5  Open MPI 5, mpich5  MPICH 5, impi  Intel MPI 2021: their PyPI
#             wheels, fetched into .cache/mpi by scripts/fetch-mpis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: $0 mpich|openmpi5|mpich5|impi}
case "$name" in
mpich)
    command -v mpicc.mpich >/dev/null && command -v mpiexec.mpich >/dev/null || {
        echo "mpi-smoke: mpicc.mpich / mpiexec.mpich not found (apt-get install mpich libmpich-dev)" >&2
        exit 1
    }
    mpicc=mpicc.mpich launcher=mpiexec.mpich mpi=mpich lib='libmpich\.so'
    ;;
openmpi5 | mpich5 | impi)
    prefix=$PWD/$(bash scripts/fetch-mpis.sh "$name")
    mpicc=$prefix/bin/mpicc launcher=$prefix/bin/mpiexec lib="$prefix/lib/libmpi\.so"
    mpi=${name%5}
    # Intel's wrapper finds its own tree through I_MPI_ROOT.
    [[ "$name" == impi ]] && export I_MPI_ROOT=$prefix
    ;;
*)
    echo "mpi-smoke: unknown MPI $name (mpich, openmpi5, mpich5, impi)" >&2
    exit 2
    ;;
esac
target=${CARGO_TARGET_DIR:-target}/mpi-$name
MPICC=$mpicc CARGO_TARGET_DIR="$target" cargo build --release --bin rankmesh -q
bin=$target/release/rankmesh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
ok() { n=$((n + 1)); echo "ok    $*"; }
fail() { echo "FAIL  $1" >&2; [ -f "${2:-}" ] && tail -20 "$2" >&2; exit 1; }
run() { RANKMESH_MPIEXEC=$launcher RANKMESH_MPI=$mpi timeout 120 bash scripts/mpirun-local.sh "$@"; }
# Rank 0's host plane says it has no GPU; keep the logs to what matters.
export RANKMESH_LOG=error

ldd "$bin" > "$tmp/ldd"
grep -q "$lib" "$tmp/ldd" || fail "the build does not link $name's library" "$tmp/ldd"
ok "built against $($mpicc -show | tr ' ' '\n' | grep -m1 '^-I'), links $(grep -m1 -o "$lib[^ ]*" "$tmp/ldd" | head -1)"

for np in 1 2 3 4; do
    run -np "$np" "$bin" topo --json > "$tmp/topo" 2>&1 || fail "topo np $np" "$tmp/topo"
    grep -q "\"world_size\":$np" "$tmp/topo" || fail "topo np $np: world_size" "$tmp/topo"
done
ok "topo on 1-4 ranks"
run -np 4 "$bin" topo --tp 2 --sp 2 > "$tmp/fv" 2>&1 || fail "topo --tp 2 --sp 2" "$tmp/fv"
grep -q "tp=2 sp=2 dp=2" "$tmp/fv" || fail "FastVideo layout" "$tmp/fv"
run -np 4 "$bin" topo --mesh pp=2,tp=2 --json > "$tmp/mesh" 2>&1 || fail "topo --mesh" "$tmp/mesh"
grep -q '"groups":{"pp":\[0,2\],"tp":\[0,1\]}' "$tmp/mesh" || fail "mesh layout" "$tmp/mesh"
ok "FastVideo (tp 2, sp 2) and mesh (pp 2, tp 2) layouts on 4 ranks"

for np in 2 3; do
    for op in all_reduce all_gather broadcast reduce_scatter reduce gather scatter alltoall \
              all_to_all_4d alltoallv all_gather_v sendrecv broadcast_object; do
        dtype=float
        [ "$op" = broadcast_object ] && dtype=uint8
        run -np "$np" "$bin" bench "$op" -d "$dtype" -b 8 -e 4M -f 16 -n 3 -w 1 -c 1 > "$tmp/b" 2>&1 \
            || fail "bench $op np $np" "$tmp/b"
        grep -q "Out of bounds values : 0 OK" "$tmp/b" || fail "bench $op np $np: not validated" "$tmp/b"
    done
done
ok "every host op validated (bench -c 1, 8 B - 4 MiB) at np 2 and 3"

if run -np 1 "$bin" bench all_reduce -b 8 -e 8 -n 3 -w 0 : -np 1 "$bin" bench all_reduce -b 64 -e 64 -n 3 -w 0 \
    > "$tmp/mm" 2>&1; then fail "a mismatched call succeeded" "$tmp/mm"; fi
[ "$(grep -c 'ranks disagree: group rank 0 passed all_reduce(shape \[2\] f32, op sum) but group rank 1 passed all_reduce(shape \[16\] f32' "$tmp/mm")" = 2 ] \
    || fail "the mismatch is not named on both ranks" "$tmp/mm"
ok "a mismatched call is named on every rank"

RANKMESH_INIT_TIMEOUT=3 run -np 1 "$bin" topo : -np 1 sleep 20 > "$tmp/init" 2>&1 || true
grep -q "start-up did not finish within 3.0 s (RANKMESH_INIT_TIMEOUT): waiting in MPI_Init; \(rank 1 (on [^)]*) has not started rankmesh\|the ranks that have not started cannot be named\)" "$tmp/init" \
    || fail "a rank that never starts is neither named nor said to be unnameable" "$tmp/init"
ok "a rank that never starts: $(grep -o 'rank 1 (on [^)]*) has not started rankmesh\|cannot be named' "$tmp/init" | head -1)"

# This build started by another MPI's launcher: every process would be a
# world of one, running the job twice; each refuses instead.
if [[ "$name" == openmpi5 ]]; then
    other_launch=(mpiexec.mpich -n 2) says="a hydra launcher (MPICH, Intel MPI) started 2 processes"
else
    other_launch=(mpirun --oversubscribe -np 2) says="Open MPI's mpirun started 2 processes"
fi
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "${other_launch[@]}" "$bin" topo > "$tmp/cross" 2>&1; then
    fail "another MPI's launcher ran the job as singletons" "$tmp/cross"
fi
if [ "$(grep -c "$says.*each started as a singleton" "$tmp/cross")" = 2 ]; then
    ok "started by another MPI's launcher (${other_launch[0]}): refused by both processes"
elif grep -q "MPI_Init_thread(.*) failed" "$tmp/cross"; then
    # MPICH 5 sees the other launcher's PMIx and refuses in MPI_Init itself.
    ok "started by another MPI's launcher (${other_launch[0]}): refused by the MPI library in MPI_Init"
else
    fail "the launcher mismatch is not named by both processes" "$tmp/cross"
fi

RANKMESH_TIMEOUT=3 run -np 2 "$bin" bench all_reduce -b 8 -e 8 -n 1000000000 -w 1 > "$tmp/stop" 2>&1 &
job=$!
sleep 2
stopped=$(pgrep -f "$bin bench all_reduce -b 8 -e 8 -n 1000000000" | tail -1)
kill -STOP "$stopped"
wait "$job" || true
kill -CONT "$stopped" 2>/dev/null || true
grep -q "pid $stopped, process stopped): has not entered this call" "$tmp/stop" \
    || fail "the watchdog did not name the stopped rank" "$tmp/stop"
ok "the watchdog names a stopped rank (RANKMESH_TIMEOUT=3)"

run -np 2 "$bin" doctor > "$tmp/doc" 2>&1 || fail "doctor np 2" "$tmp/doc"
grep -q "verdict: OK" "$tmp/doc" || fail "doctor verdict" "$tmp/doc"
run -np 4 "$bin" workload --tp 2 --sp 2 --steps 3 > "$tmp/wl" 2>&1 || fail "workload" "$tmp/wl"
grep -q "workload OK" "$tmp/wl" || fail "workload" "$tmp/wl"
ok "doctor on 2 ranks, the TP/SP workload on 4"

if [[ "$name" == openmpi5 ]]; then
    other="MPICH Version: 4.0.2" built="Open MPI"
else
    other="Open MPI v4.1.4, package: Debian OpenMPI" built="\(MPICH\|Intel MPI\)"
fi
cat > "$tmp/other.c" <<C
#include <string.h>
int MPI_Get_library_version(char *v, int *n) {
    const char *s = "$other";
    strcpy(v, s);
    *n = (int)strlen(s);
    return 0;
}
C
cc -shared -fPIC -o "$tmp/other.so" "$tmp/other.c"
if LD_PRELOAD="$tmp/other.so" "$bin" topo > "$tmp/abi" 2>&1; then fail "another family's library was accepted" "$tmp/abi"; fi
grep -q "rankmesh was built against $built .* but the MPI library loaded is \"$other" "$tmp/abi" \
    || fail "the library mismatch is not named" "$tmp/abi"
ok "a library of the other family (\"$other\") is refused before MPI_Init"
echo "mpi-smoke $name: $n checks passed ($("$launcher" --version 2>&1 | grep -m1 -E 'Version|Open MPI' | tr -s ' '))"
