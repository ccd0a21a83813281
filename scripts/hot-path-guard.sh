#!/usr/bin/env bash
# The hot path's budget (issue #65), a step of scripts/test.sh. CI cannot
# time a call, but it can count what one does. Per call of an 8 B
# all_reduce on rank 0 of 2 (its peer runs natively, so rank 0 rarely
# waits), for the host plane's shared-memory window and for the device
# plane's deferred call on the CUDA and NCCL emulators:
#   - instructions of rankmesh's own code on the calling thread (callgrind,
#     --separate-threads; libc, MPI and the emulators are not counted, nor
#     rankmesh's clock reads and NCCL ready polls: such wait loops made a
#     whole-process count vary by 10% from run to run, these by 0.2%);
#   - system calls of the whole process (strace -f -c): the emulator's own
#     transport makes 3 per device call, rankmesh none.
# Each per-call figure is the difference of two runs (-n 2000 and 6000; two
# calls an iteration: the out-of-place and the in-place column), checked
# against scripts/hot-path-budget.txt. A change that raises a budget says
# why in its commit body. `--record` prints the figures instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
record=${1:-}
for tool in valgrind callgrind_annotate strace; do
    command -v "$tool" >/dev/null || {
        echo "hot-path-guard: $tool not found (scripts/install-deps.sh --test installs it)" >&2
        exit 1
    }
done
cargo build -q --release --bin rankmesh
bin=$PWD/target/release/rankmesh
# The emulators, built by the device test binary (as scripts/python-test.sh).
emu=$PWD/target/hot-path-emulators
cargo build -q --test gpu
gpu_test=$(ls -t target/debug/deps/gpu-* | grep -v '\.d$' | head -n1)
RANKMESH_EMU_BUILD="$emu" "$gpu_test" >/dev/null 2>&1 || true
[[ -f $emu/libnccl.so.2 ]] || { echo "hot-path-guard: the emulators were not built into $emu" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
budget=scripts/hot-path-budget.txt
low=2000 high=6000
calls=$((2 * (high - low)))

# `launch MODE N TOOL...`: the bench on 2 ranks, rank 0 under TOOL.
launch() {
    local mode=$1 n=$2
    shift 2
    local args=(bench all_reduce -b 8 -e 8 -n "$n" -w 0 -c 0)
    local envs=()
    if [[ $mode == device ]]; then
        args+=(--backend nccl)
        # Exported, and named with -x: a value given to -x reaches only the
        # first of mpirun's app contexts.
        export LD_LIBRARY_PATH=$emu RANKMESH_NCCL_LIB=$emu/libnccl.so.2 RANKMESH_EMU_GPUS=2 \
            RANKMESH_EMU_ASYNC=0 RANKMESH_CHECK=deferred
        envs=(-x LD_LIBRARY_PATH -x RANKMESH_NCCL_LIB -x RANKMESH_EMU_GPUS -x RANKMESH_EMU_ASYNC -x RANKMESH_CHECK)
    fi
    timeout 300 mpirun --oversubscribe --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "${envs[@]}" \
        -np 1 "$@" "$bin" "${args[@]}" : -np 1 "$bin" "${args[@]}" >"$work/out" 2>&1 || {
        echo "hot-path-guard: the $mode run (-n $n) failed:" >&2
        grep -v '^==' "$work/out" | tail -n 20 >&2
        return 1
    }
}

# Instructions of rankmesh's own code on rank 0's calling thread.
own_instructions() {
    local mode=$1 n=$2 out=$work/cg.$1.$2
    launch "$mode" "$n" valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$out" || return 1
    # Less the loops that only run while a peer or the device is awaited
    # (clock reads, NCCL's ready poll): their count follows timing.
    callgrind_annotate --inclusive=no --threshold=100 "$out-01" |
        grep -vE 'Instant>::|Timespec>::|nccl::comm::Communicator::ready ' |
        awk -v b="[$bin]" 'index($0, b) { gsub(",", "", $1); s += $1 } END { print s + 0 }'
}

# System calls of rank 0's process, every thread.
syscalls() {
    local mode=$1 n=$2 out=$work/st.$1.$2
    launch "$mode" "$n" strace -f -c -o "$out" || return 1
    awk '$NF == "total" { print $(NF - 2) }' "$out"
}

per_call() { awk -v a="$1" -v b="$2" -v c="$calls" 'BEGIN { printf "%.3f", (b - a) / c }'; }

failed=0
for mode in host device; do
    # One assignment each, so that a failed run ends the script.
    ins_low=$(own_instructions "$mode" "$low")
    ins_high=$(own_instructions "$mode" "$high")
    sys_low=$(syscalls "$mode" "$low")
    sys_high=$(syscalls "$mode" "$high")
    ins=$(per_call "$ins_low" "$ins_high")
    sys=$(per_call "$sys_low" "$sys_high")
    for figure in "${mode}_instructions $ins" "${mode}_syscalls $sys"; do
        read -r name value <<<"$figure"
        if [[ $record == --record ]]; then
            echo "$name $value"
            continue
        fi
        limit=$(awk -v n="$name" '$1 == n { print $2 }' "$budget")
        if [[ -z $limit ]]; then
            echo "hot-path-guard: $budget has no budget for $name" >&2
            failed=1
        elif awk -v v="$value" -v l="$limit" 'BEGIN { exit !(v > l) }'; then
            echo "hot-path-guard: $name is $value per call, over its budget of $limit ($budget)" >&2
            failed=1
        else
            echo "hot-path-guard: $name $value per call (budget $limit)"
        fi
    done
done
exit "$failed"
