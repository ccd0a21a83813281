#!/usr/bin/env bash
# A job that loses a rank goes on (issue #66): examples/elastic_dp built
# against Open MPI 5 (the PyPI wheel, which has ULFM) and started with
# `mpirun --with-ft ulfm`. Each trial kills ranks with SIGKILL, inside a
# step (the others wait in their all-reduce) or between steps, on the
# shared-memory and the MPI host planes, at 3-6 ranks, one or two ranks at
# once, in two losses and while the others shrink. Every survivor must
# name the lost ranks, shrink, finish and match the serial replay; the job
# must exit 0 with no process and nothing in /dev/shm left, and the
# runtime after the shrink must hold no more threads and sockets than
# before the loss; the same with
# the sums on the device plane (NCCL emulator). With replicas
# of 2 ranks (dp × tp), or FastVideo's layout, a lost rank's partners
# retire and the other replicas go on; a loss in every replica is an error. The same from
# Python. One trial without --with-ft ulfm keeps today's answer: the job
# ends, non-zero. With `--bench`, then, the recovery time (the kill to the
# survivors' first completed step) against a restart of the same job.
# Usage: scripts/ulfm-test.sh [--bench]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$PWD/$(bash scripts/fetch-mpis.sh openmpi5)
target=${CARGO_TARGET_DIR:-target}/mpi-openmpi5
MPICC=$prefix/bin/mpicc CARGO_TARGET_DIR="$target" cargo build --release -q --example elastic_dp
bin=$target/release/examples/elastic_dp
export RANKMESH_MPIEXEC=$prefix/bin/mpiexec RANKMESH_MPI=openmpi RANKMESH_LOG=error
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=0
fail() { echo "FAIL  $1" >&2; [ -f "${2:-}" ] && grep -av "^ *$" "$2" | tail -30 >&2; exit 1; }
run() { timeout 120 bash scripts/mpirun-local.sh "$@"; }

# no_leak NAME OUT [threads]: every survivor's runtime after a shrink
# holds no more threads or sockets than before the loss (elastic_dp
# counts them); only threads across nodes, where Open MPI opens a TCP
# link to a peer at their first message, which a shrink's agreement may
# be.
no_leak() {
    local what="; LEAKED"
    [[ ${3:-} == threads ]] && what="; LEAKED threads"
    grep -aq "$what" "$2" &&
        fail "$1: a runtime after the shrink holds more threads or sockets than before the loss" "$2"
    if grep -aq "is rank [0-9]* of [0-9]* after losing" "$2"; then
        grep -aq "after the shrink: [0-9]* threads" "$2" || fail "$1: no survivor counted its threads and sockets" "$2"
    fi
}

# trial NAME NP PLANE LOST ARGS...: LOST, the first-world ranks killed.
trial() {
    local name=$1 np=$2 plane=$3 lost=$4
    shift 4
    local out=$tmp/$name
    RANKMESH_HOST_PLANE=$plane run --with-ft ulfm -np "$np" "$bin" "$@" > "$out" 2>&1 ||
        fail "$name: the job exited $?" "$out"
    local survivors=$((np - $(wc -w <<< "${lost//,/ }")))
    local matched
    matched=$(grep -ac "parameters match the serial replay" "$out" || true)
    ((matched == survivors)) || fail "$name: $matched of $survivors survivors matched the serial replay" "$out"
    # Every survivor's first answer names a lost rank of the first loss.
    local first=${lost%%,*}
    local named
    named=$(grep -acE "world ranks \[[0-9][0-9, ]*\] lost \(at" "$out" || true)
    ((named >= survivors)) || fail "$name: $named answers naming a lost rank for $survivors survivors" "$out"
    grep -aq "world ranks \[\] lost" "$out" && fail "$name: a survivor's answer names no lost rank" "$out"
    grep -aq "after losing first-world ranks \[$first" "$out" || fail "$name: the shrink did not lose rank $first" "$out"
    no_leak "$name" "$out"
    pgrep -f "$bin" >/dev/null && fail "$name: processes left after the job" "$out"
    n=$((n + 1))
    echo "ok    $name"
}

# Nothing the trials' processes made in /dev/shm may stay (rankmesh names
# nothing there; Open MPI's segments go with its session).
shm_before=$(ls /dev/shm | sort)
trial "np 3, shm, a rank killed inside an all_reduce" 3 shm 1 --kill 1@2
trial "np 4, mpi, a rank killed inside an all_reduce" 4 mpi 2 --kill 2@3
trial "np 4, shm, rank 0 killed between calls" 4 shm 0 --kill-idle 0@4
trial "np 4, mpi, a rank killed between calls" 4 mpi 3 --kill-idle 3@1
trial "np 5, auto, two ranks killed at once" 5 auto 1,3 --kill 1@2 --kill 3@2
trial "np 6, mpi, two losses, two shrinks" 6 mpi 4,2 --kill 4@1 --kill 2@5
trial "np 6, shm, two losses, two shrinks" 6 shm 0,5 --kill 0@2 --kill-idle 5@4
trial "np 5, mpi, a rank dies while the others shrink" 5 mpi 1,3 --kill 1@2 --die-in-shrink 3
trial "np 4, shm, a rank dies while the others shrink" 4 shm 0,2 --kill-idle 0@1 --die-in-shrink 2
# The replicas' sum from one batch of sends and receives: the survivors
# wait inside their batch for the killed rank's messages.
trial "np 4, a rank killed inside a p2p batch" 4 auto 2 --p2p --kill 2@2
trial "np 5, two ranks killed inside a p2p batch" 5 auto 1,3 --p2p --kill 1@3 --kill 3@3
trial "np 4, p2p, rank 0 killed between calls" 4 auto 0 --p2p --kill-idle 0@1

# judge NAME OUT KEPT RETIRED [threads]: KEPT ranks matched the serial
# replay, RETIRED retired, nothing leaked (see no_leak), and no process
# of the job is left.
judge() {
    local name=$1 out=$2 kept=$3 retired=$4 matched went
    matched=$(grep -ac "parameters match the serial replay" "$out" || true)
    went=$(grep -ac "retired after losing" "$out" || true)
    ((matched == kept && went == retired)) ||
        fail "$name: $matched ranks matched the serial replay ($kept kept), $went retired ($retired)" "$out"
    no_leak "$name" "$out" "${5:-}"
    pgrep -f "$bin" >/dev/null && fail "$name: processes left after the job" "$out"
    n=$((n + 1))
    echo "ok    $name"
}

# A layout after a loss (dp × tp, tp 2): a lost rank's replica retires
# whole, its TP partner exits 0 saying so, the other replicas go on.
# layout_trial NAME NP PLANE RETIRED KEPT ARGS...
layout_trial() {
    local name=$1 np=$2 plane=$3 retired=$4 kept=$5
    shift 5
    local out=$tmp/$name
    RANKMESH_HOST_PLANE=$plane run --with-ft ulfm -np "$np" "$bin" --tp 2 "$@" > "$out" 2>&1 ||
        fail "$name: the job exited $?" "$out"
    judge "$name" "$out" "$kept" "$retired"
}
layout_trial "np 4, shm, tp 2: a TP rank lost, its replica retires" 4 shm 1 2 --kill 1@2
layout_trial "np 4, mpi, tp 2: a TP rank lost, its replica retires" 4 mpi 1 2 --kill 1@2
layout_trial "np 6, auto, tp 2: two replicas hit at once" 6 auto 2 2 --kill 3@1 --kill 4@1
# FastVideo's layout (ParallelState, sp 3): Layout::after_loss keeps whole
# SP groups and shrinks DP.
layout_trial "np 6, auto, FastVideo sp 3: a lost rank's SP group retires" 6 auto 2 3 --fastvideo --tp 3 --kill 4@2
out=$tmp/every-replica
RANKMESH_HOST_PLANE=mpi run --with-ft ulfm -np 4 "$bin" --tp 2 --kill 1@2 --kill 2@2 > "$out" 2>&1 &&
    fail "np 4, tp 2, a loss in every replica: the job went on" "$out"
said=$(grep -ac "the lost ranks \[1, 2\] are in every one of the 2 dp replicas; no whole replica survives" "$out" || true)
((said == 2)) || fail "np 4, tp 2, a loss in every replica: $said of 2 survivors said why" "$out"
n=$((n + 1))
echo "ok    np 4, tp 2: a loss in every replica is an error on every survivor"

# Two fake nodes of 2 ranks (their own network namespaces: PRRTE refuses
# loopback alone), the sums across them over TCP: a loss that leaves a
# node one rank, one between calls, a replica retiring across nodes.
node_trial() {
    local name=$1 kept=$2 retired=$3
    shift 3
    local out=$tmp/$name
    RANKMESH_MPIEXEC=$prefix/bin/mpirun RANKMESH_FAKE_NET=1 timeout 120 bash scripts/fake-nodes.sh 2 2 \
        --with-ft ulfm "$bin" "$@" > "$out" 2>&1 || fail "$name: the job exited $?" "$out"
    judge "$name" "$out" "$kept" "$retired" threads
}
node_trial "2 nodes × 2, rank 1 killed inside a step: node 0 left with one rank" 3 0 --kill 1@2
node_trial "2 nodes × 2, rank 3 killed between calls" 3 0 --kill-idle 3@1
node_trial "2 nodes × 2, tp 2: a replica (one node) retires" 2 1 --tp 2 --kill 2@2
# After the last step: no call fails, and the survivors' exit must not
# wait for the dead rank (Open MPI's MPI_Finalize would, forever).
node_trial "2 nodes × 2, rank 0 killed after the last step: the others exit" 3 0 --kill-idle 0@7

# The device plane on the CUDA and NCCL emulators, built against Open MPI
# 5 (the NCCL emulator carries its bootstrap over that MPI): the replicas'
# sum runs on NCCL; the survivors get PeerLost there too, and the shrink
# carries the world's NCCL communicator over with ncclCommShrink (no
# warning that it was not). With NCCL 2.18, which has no ncclCommShrink,
# the shrink says so and groups connect afresh.
cargo build -q --test gpu
gpu_test=$(ls -t "${CARGO_TARGET_DIR:-target}"/debug/deps/gpu-* | grep -v '\.d$' | head -n1)
emu=$PWD/${CARGO_TARGET_DIR:-target}/emulators-openmpi5
MPICC=$prefix/bin/mpicc RANKMESH_EMU_BUILD="$emu" "$gpu_test" >/dev/null 2>&1 || true
[[ -f $emu/libnccl.so.2 ]] || fail "the NCCL emulator was not built into $emu"
device_trial() {
    local name=$1 nccl=$2 np=$3 kept=$4 retired=$5 shrunk=$6
    shift 6
    local out=$tmp/$name
    LD_LIBRARY_PATH=$emu RANKMESH_NCCL_LIB=$nccl RANKMESH_EMU_GPUS=8 run --with-ft ulfm \
        -x LD_LIBRARY_PATH -x RANKMESH_NCCL_LIB -x RANKMESH_EMU_GPUS -np "$np" "$bin" --device "$@" \
        > "$out" 2>&1 || fail "$name: the job exited $?" "$out"
    local refused
    refused=$(grep -ac "world's NCCL communicator was not shrunk" "$out" || true)
    if ((shrunk)); then
        ((refused == 0)) || fail "$name: $refused survivors did not shrink the NCCL communicator" "$out"
    else
        ((refused == kept)) || fail "$name: $refused of $kept survivors said NCCL could not shrink" "$out"
    fi
    judge "$name" "$out" "$kept" "$retired"
}
device_trial "np 4, device: a rank killed inside a step, ncclCommShrink" "$emu/libnccl.so.2" 4 3 0 1 --kill 1@2
device_trial "np 5, device: two ranks killed at once" "$emu/libnccl.so.2" 5 3 0 1 --kill 1@2 --kill 3@2
device_trial "np 4, device: a rank killed between calls" "$emu/libnccl.so.2" 4 3 0 1 --kill-idle 3@1
device_trial "np 6, device, tp 2: a replica retires, the others shrink" "$emu/libnccl.so.2" 6 4 1 1 --tp 2 --kill 1@2
device_trial "np 6, device, FastVideo sp 2: an SP group retires" "$emu/libnccl.so.2" 6 4 1 1 \
    --fastvideo --tp 2 --kill 2@2
device_trial "np 4, device, NCCL 2.18: no ncclCommShrink, groups connect afresh" \
    "$emu/nccl-2.18/libnccl.so.2" 4 3 0 0 --kill 2@3

# The same from Python: the package built against Open MPI 5 (its own
# target and install directories), PeerLostError and rankmesh.shrink().
venv=${RANKMESH_PY_VENV:-target/python-venv}
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
[ -x "$venv/bin/maturin" ] ||
    "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "maturin>=1.5,<2" numpy
site=${CARGO_TARGET_DIR:-target}/python-ompi5-site
PATH="$PWD/$venv/bin:$PATH" MPICC=$prefix/bin/mpicc CARGO_TARGET_DIR="$PWD/${CARGO_TARGET_DIR:-target}/python-ompi5" \
    "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --upgrade \
    --target "$site" ./python
out=$tmp/python
PYTHONPATH="$PWD/$site${PYTHONPATH:+:$PYTHONPATH}" run --with-ft ulfm -np 4 "$venv/bin/python" \
    examples/python/elastic_dp.py --kill 1@2 > "$out" 2>&1 || fail "Python: the job exited $?" "$out"
matched=$(grep -ac "parameters match the serial replay" "$out" || true)
((matched == 3)) || fail "Python: $matched of 3 survivors matched the serial replay" "$out"
grep -aq "losses \[(\[1\], \[1\])\]" "$out" || fail "Python: PeerLostError.lost and shrink() disagree" "$out"
n=$((n + 1))
echo "ok    Python, np 4: PeerLostError, rankmesh.shrink(), the step redone"

# Without ULFM: the loss ends the job, as before issue #66.
out=$tmp/without
if run -np 3 "$bin" --kill 1@2 > "$out" 2>&1; then
    fail "without --with-ft ulfm the job went on" "$out"
fi
grep -aq "parameters match" "$out" && fail "without --with-ft ulfm a survivor finished" "$out"
n=$((n + 1))
echo "ok    without --with-ft ulfm, a lost rank ends the job (as before)"
left=$(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort))
[ -z "$left" ] || fail "files left in /dev/shm: $left"
n=$((n + 1))
echo "ok    nothing left in /dev/shm"
echo "ulfm-test: $n checks passed"

[[ "${1:-}" == --bench ]] || exit 0
# The kill to the last survivor's first completed step after the shrink,
# against the same job restarted (mpirun + Runtime::init + its world
# group + one step), medians of 5.
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for np in 4 8; do
    for i in 1 2 3 4 5; do
        out=$tmp/bench
        run --with-ft ulfm -np "$np" "$bin" --steps 6 --kill 1@3 > "$out" 2>&1 || fail "bench np $np" "$out"
        killed=$(grep -ao "kills itself inside step 3 at [0-9]*" "$out" | awk '{print $NF}')
        last=$(grep -ao "first step after the loss done at [0-9]*" "$out" | awk '{print $NF}' | sort -n | tail -1)
        echo $(((last - killed) / 1000)) >> "$tmp/recover-$np"
        start=$(date +%s%N)
        run --with-ft ulfm -np $((np - 1)) "$bin" --steps 1 > "$out" 2>&1 || fail "restart np $np" "$out"
        echo $((($(date +%s%N) - start) / 1000000)) >> "$tmp/restart-$np"
    done
    echo "np $np: the kill to the first step after the shrink: $(median < "$tmp/recover-$np") ms" \
        "(runs: $(tr '\n' ' ' < "$tmp/recover-$np")); a restart on $((np - 1)) ranks:" \
        "$(median < "$tmp/restart-$np") ms (runs: $(tr '\n' ' ' < "$tmp/restart-$np"))"
done
