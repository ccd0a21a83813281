#!/usr/bin/env bash
# The GPU data plane's check on a CUDA machine, in one command that fits a
# short GPU slot: every check is a row of REPORT_DIR/gpu-report.md and
# gpu-report.json (pass or fail, with the reason or the figure); the logs of
# each step are REPORT_DIR/gpu-check.log. Exits non-zero if any check failed.
#
#   bash scripts/gpu-check.sh [REPORT_DIR]          # builds with cargo first
#   RANKMESH_PREBUILT=DIR bash scripts/gpu-check.sh [REPORT_DIR]
#       # a host without Rust or MPI: DIR from `bash scripts/gpu-bundle.sh DIR`
#
# NCCL is the one rankmesh's loader finds (RANKMESH_NCCL_LIB, else the
# nvidia-nccl wheel of the `python3` on PATH, else libnccl.so.2); the report
# names it. scripts/gpu-rehearse.sh runs this same script against the CUDA
# and NCCL emulators and a stand-in nvidia-smi, so CI catches a broken script.
#
# One GPU gives a group of one. rankmesh runs a group of one as local copies;
# here most runs set RANKMESH_NCCL_FOR_ONE=1, so every op goes through NCCL's
# own kernels on a one-rank communicator, and the bench compares like with
# like against raw NCCL.
set -uo pipefail
cd "$(dirname "$0")/.."
report=$(mkdir -p "${1:-gpu-report}" && cd "${1:-gpu-report}" && pwd)
log=$report/gpu-check.log
rows=$report/rows.tsv
: >"$log"
: >"$rows"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
# NCCL says why it refuses a call (the log keeps it).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Each step's limit: a hang costs one row, not the slot.
step_limit=${GPU_CHECK_STEP_LIMIT:-120}
started=$(date +%s)

# The host's own environment, for PyTorch: the bundle's libraries are for
# rankmesh and Open MPI only.
host_ld=${LD_LIBRARY_PATH-}
# Speed targets apply to a GPU; the rehearsal on the emulators (host memory,
# no GPU) records its figures without them, and caps the large sizes.
targets=${GPU_CHECK_TARGETS:-on}
large=${GPU_CHECK_LARGE:-1G}
if [[ -n "${RANKMESH_PREBUILT:-}" ]]; then
    pre=$(cd "$RANKMESH_PREBUILT" && pwd)
    bin=$pre/rankmesh
    gpu_test=$pre/gpu
    if [[ -d $pre/mpiroot ]]; then
        root=$pre/mpiroot
        export LD_LIBRARY_PATH=$pre/lib:$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export OPAL_PREFIX=$root/usr PMIX_INSTALL_PREFIX=$root/usr/lib/x86_64-linux-gnu/pmix2
        export PATH=$root/usr/bin:$PATH
    fi
else
    cargo build --release --bin rankmesh --test gpu
    bin=target/release/rankmesh
    gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -n1)
    mpicc -O2 -o target/mpi_startup scripts/mpi_startup.c 2>/dev/null || true
fi
mpirun_bin=$(command -v mpirun.openmpi || command -v mpirun)
forward=()
for v in LD_LIBRARY_PATH OPAL_PREFIX PMIX_INSTALL_PREFIX PATH RANKMESH_NCCL_LIB RANKMESH_DEVICE \
    RANKMESH_EMU_GPUS RANKMESH_EMU_BUS; do
    [[ -n "${!v:-}" ]] && forward+=(-x "$v")
done
mpi=("$mpirun_bin" --oversubscribe --bind-to none "${forward[@]}")

# `run NAME CMD...`: runs CMD under the step limit, its output appended to
# the log and kept in $out; $rc and $secs say how it ended.
run() {
    local name=$1; shift
    local t0 t1
    echo "== $name: $*" >>"$log"
    t0=$(date +%s.%N)
    out=$(timeout -k 5 "$step_limit" "$@" 2>&1)
    rc=$?
    t1=$(date +%s.%N)
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\n-- rc %s after %s s\n' "$out" "$rc" "$secs" >>"$log"
    ((rc == 124 || rc == 137)) && out+=$'\n'"(stopped at the ${step_limit} s step limit)"
}
# `row NAME pass|fail|skip DETAIL`
row() {
    printf '%s\t%s\t%s\n' "$1" "$2" "$(tr '\t\n' '  ' <<<"$3" | sed 's/ *$//')" >>"$rows"
    printf '%-4s  %s: %s\n' "$2" "$1" "$3"
}
first_failure() {
    grep -m1 -E 'FAILED|error|panicked|stopped at' <<<"$out" | cut -c1-300
}

# ---- header: the machine, the driver, CUDA, NCCL ----
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | grep -o '[0-9.]*$' | head -n1)
run "topo" "${mpi[@]}" -np 1 "$bin" topo --json
nccl_version=$(grep -o '"nccl":{"version":"[^"]*"' <<<"$out" | sed 's/.*"version":"//; s/"$//')
nccl_path=$(grep -o '"nccl":{[^}]*"path":"[^"]*"' <<<"$out" | sed 's/.*"path":"//; s/"$//')
if [[ -n $nccl_version ]]; then
    row "NCCL loaded, version reported (topo --json)" pass "NCCL $nccl_version from $nccl_path"
else
    row "NCCL loaded, version reported (topo --json)" fail "$(head -c 300 <<<"$out")"
fi

# ---- correctness on real memory ----
export RANKMESH_GPU_WORKER=1
for nccl in 0 1; do
    for mode in deferred strict off; do
        if ((nccl)); then how="through NCCL (RANKMESH_NCCL_FOR_ONE=1)"; else how="as a group of one (local copies)"; fi
        name="every device op vs the host plane, all dtypes, $how, RANKMESH_CHECK=$mode"
        RANKMESH_NCCL_FOR_ONE=$nccl RANKMESH_CHECK=$mode \
            run "$name" "${mpi[@]}" -np 1 -x RANKMESH_GPU_WORKER -x RANKMESH_CHECK -x RANKMESH_NCCL_FOR_ONE "$gpu_test"
        oks=$(grep -c ': ok ' <<<"$out")
        if ((rc == 0)) && grep -q ', 0 checks failed' <<<"$out"; then
            row "$name" pass "$oks checks ok in $secs s"
        else
            row "$name" fail "rc $rc: $(first_failure)"
        fi
        all_worker+=$out$'\n'
    done
done
unset RANKMESH_GPU_WORKER
# Rows the worker runs hold: each of its six runs must have passed the check.
derived() {
    local name=$1 marker=$2 n
    n=$(grep -c ": ok $marker on world" <<<"$all_worker")
    if ((n == 6)); then
        row "$name" pass "ok in all 6 runs (3 check modes, local and through NCCL)"
    else
        row "$name" fail "ok in $n of 6 runs: $(grep -m1 "FAILED $marker" <<<"$all_worker" | cut -c1-300)"
    fi
}
derived "caller-owned cudarc buffers and views on a caller stream" "caller memory and streams"
derived "bool, 16-bit integers and fp8 (fp8 reduces on sm 9.0)" "bool, 16-bit integer and fp8 dtypes"
derived "random-data numerics against a float64 reference" "numerics on random data"

# ---- the life cycle on the real library ----
# NCCL's own INFO lines count communicators made and destroyed (the
# emulator prints its counters instead).
live_check() {
    local inits destroys
    if grep -q '^emulator counts:' <<<"$out"; then
        grep '^emulator counts:' <<<"$out" | grep -qv ' live=0$' && { echo "left live: $(grep '^emulator counts:' <<<"$out" | head -n1)"; return 1; }
        echo "emulator: $(grep -m1 '^emulator counts:' <<<"$out" | sed 's/^emulator counts: //')"
        return 0
    fi
    inits=$(grep -c 'Init COMPLETE' <<<"$out")
    destroys=$(grep -cE '(Destroy|Abort) COMPLETE' <<<"$out")
    echo "$inits communicators made, $destroys destroyed"
    ((inits > 0 && inits == destroys))
}
export NCCL_DEBUG_SUBSYS=INIT RANKMESH_EMU_COUNTS=1
name="non-blocking creation, connect_devices, then ncclCommSplit per group (world, TP, SP, DP, mesh, a partial split)"
NCCL_DEBUG=INFO RANKMESH_GPU_SPLIT_CHECK=1 \
    run "$name" "${mpi[@]}" -np 1 -x RANKMESH_GPU_SPLIT_CHECK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x RANKMESH_EMU_COUNTS "$gpu_test"
live=$(live_check); live_ok=$?
splits=$(grep -c 'ncclCommSplit' <<<"$out")
if ((rc == 0)) && grep -q '^SPLIT-OK' <<<"$out" && ((live_ok == 0)); then
    row "$name" pass "$(grep -m1 '^SPLIT-OK' <<<"$out" | sed 's/SPLIT-OK //'); $splits NCCL lines naming ncclCommSplit; $live"
else
    row "$name" fail "rc $rc; $live; $(grep -m1 -E 'SPLIT-FAILED|error|panicked' <<<"$out" | cut -c1-300)"
fi
for r in 1 2; do
    name="bench -R $r: buffers from ncclMemAlloc, registered, validated, finalized and destroyed"
    NCCL_DEBUG=INFO RANKMESH_NCCL_FOR_ONE=1 \
        run "$name" "${mpi[@]}" -np 1 -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x RANKMESH_EMU_COUNTS -x RANKMESH_NCCL_FOR_ONE \
        "$bin" bench all_reduce --backend nccl -b 8 -e 64M -f 64 -n 20 -w 2 -c 1 -R "$r"
    live=$(live_check); live_ok=$?
    note=$(grep -m1 -i 'registration\|-R ' <<<"$out" | grep '^#' | cut -c1-200)
    if ((rc == 0)) && grep -q 'Out of bounds values : 0 OK' <<<"$out" && ((live_ok == 0)); then
        row "$name" pass "0 wrong; $live${note:+; $note}"
    else
        row "$name" fail "rc $rc; $live; $(first_failure)"
    fi
done

# ---- errors that must reach every rank ----
name="two ranks on one GPU: one clear error on both, before NCCL's 'Duplicate GPU detected'"
if ((ngpu == 1)); then
    run "$name" "${mpi[@]}" -np 2 "$bin" bench all_reduce --backend nccl -b 8 -e 8
    named=$(grep -c 'would share GPU' <<<"$out")
    if ((rc != 0)) && ((named == 2)) && ! grep -q 'Duplicate GPU' <<<"$out" && awk -v s="$secs" 'BEGIN { exit !(s < 30) }'; then
        row "$name" pass "both ranks, after $secs s: $(grep -m1 'would share GPU' <<<"$out" | cut -c1-200)"
    else
        row "$name" fail "rc $rc, named on $named of 2 ranks, $secs s: $(grep -m1 -E 'error|Duplicate' <<<"$out" | cut -c1-300)"
    fi
else
    row "$name" skip "$ngpu GPUs here: the ranks get one GPU each"
fi
name="a rank without a GPU (CUDA_VISIBLE_DEVICES= on rank 1): a clear error on every rank naming it"
run "$name" "${mpi[@]}" \
    -np 1 "$bin" bench all_reduce --backend nccl -b 8 -e 8 : \
    -np 1 env CUDA_VISIBLE_DEVICES= "$bin" bench all_reduce --backend nccl -b 8 -e 8
named=$(grep -cE 'error \(rank [01]\).*rank 1: no GPU visible to this process' <<<"$out")
if ((rc != 0)) && ((named == 2)) && awk -v s="$secs" 'BEGIN { exit !(s < 30) }'; then
    row "$name" pass "both ranks, after $secs s: $(grep -m1 'error (rank 0)' <<<"$out" | cut -c1-240)"
else
    row "$name" fail "rc $rc, named on $named of 2 ranks, $secs s: $(grep -m1 -E 'error|panicked' <<<"$out" | cut -c1-300)"
fi

# ---- speed against raw NCCL and PyTorch, same machine, same run ----
# bench's baseline table: "#  size  time  busbw  raw-time  raw-busbw  ratio  +time".
baseline_rows() { grep -E '^# +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +-?[0-9.]+$' <<<"$out"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }
# `verdict OK NAME FIGURE`: a speed row, against its target on a GPU.
verdict() {
    if [[ $targets != on ]]; then
        row "$2" info "$3 (targets not applied: $targets)"
    elif (($1)); then
        row "$2" pass "$3"
    else
        row "$2" fail "$3"
    fi
}
declare -A plus
for round in 1 2 3; do
    for mode in strict deferred off; do
        RANKMESH_NCCL_FOR_ONE=1 RANKMESH_CHECK=$mode \
            run "latency round $round, RANKMESH_CHECK=$mode" "${mpi[@]}" -np 1 -x RANKMESH_CHECK -x RANKMESH_NCCL_FOR_ONE \
            "$bin" bench all_reduce -b 8 -e 4K -f 8 -n 2000 -w 200 -c 1 --backend nccl --baseline nccl
        if ((rc != 0)) || ! grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
            plus[$mode]+="FAILED($rc: $(first_failure)) "
            continue
        fi
        while read -r _ size _ _ _ _ _ extra; do
            plus[$mode,$size]+="$extra "
        done < <(baseline_rows)
    done
done
for mode in strict deferred off; do
    name="all_reduce 8 B-4 KiB through NCCL, +time per call over raw ncclAllReduce, RANKMESH_CHECK=$mode"
    if [[ -n "${plus[$mode]:-}" ]]; then
        row "$name" fail "${plus[$mode]}"
        continue
    fi
    fig=""; ok=1
    for size in 8 64 512 4096; do
        m=$(tr ' ' '\n' <<<"${plus[$mode,$size]:-}" | grep . | median)
        fig+="${size} B: +$m us; "
        [[ $size == 8 ]] && ! awk -v m="$m" 'BEGIN { exit !(m != "nan" && m <= 2.0) }' && ok=0
    done
    fig+="medians of 3 rounds (target at 8 B: <= +2 us)"
    verdict "$ok" "$name" "$fig"
done
name="all_reduce 64 MiB-$large through NCCL, algbw over raw ncclAllReduce (target ratio >= 0.98)"
# Three rounds, as for the small sizes: one round of 30 calls at 64 MiB
# (~35 us each on an H200) moved by 9% between runs of the same build.
declare -A big
big_failed=""
for round in 1 2 3; do
    RANKMESH_NCCL_FOR_ONE=1 run "$name, round $round" "${mpi[@]}" -np 1 -x RANKMESH_NCCL_FOR_ONE \
        "$bin" bench all_reduce -b 64M -e "$large" -f 4 -n 30 -w 5 -c 1 --backend nccl --baseline nccl
    if ((rc != 0)) || ! grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
        big_failed="rc $rc: $(first_failure)"
        break
    fi
    while read -r _ size t _ raw _ ratio _; do
        big[sizes]+="$size "
        big[$size,t]+="$t "
        big[$size,raw]+="$raw "
        big[$size,ratio]+="$ratio "
    done < <(baseline_rows)
done
# `m FIELD`: the median of the rounds' FIELD at $size.
m() { tr ' ' '\n' <<<"${big[$size,$1]}" | grep . | median; }
if [[ -z $big_failed ]]; then
    fig=""; ok=1
    for size in $(tr ' ' '\n' <<<"${big[sizes]}" | grep . | sort -gu); do
        ratio=$(m ratio)
        fig+="$((size >> 20)) MiB: $(m t) us vs raw $(m raw) us, ratio $ratio; "
        awk -v r="$ratio" 'BEGIN { exit !(r >= 0.98) }' || ok=0
    done
    verdict "$ok" "$name" "${fig}medians of 3 rounds"
else
    row "$name" fail "$big_failed"
fi
for op in all_gather reduce_scatter broadcast alltoall all_to_all_4d; do
    name="$op through NCCL, bfloat16, 8 KiB-64 MiB, validated"
    RANKMESH_NCCL_FOR_ONE=1 run "$name" "${mpi[@]}" -np 1 -x RANKMESH_NCCL_FOR_ONE \
        "$bin" bench "$op" -b 8K -e 64M -f 64 -n 20 -w 2 -c 1 -d bfloat16 --backend nccl --baseline nccl
    if ((rc == 0)) && grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
        row "$name" pass "0 wrong; ratios $(baseline_rows | awk '{ printf "%s%s", sep, $7; sep = "/" }') at 8 KiB/512 KiB/32 MiB"
    else
        row "$name" fail "rc $rc: $(first_failure)"
    fi
done

# What the host's python3 offers the torch rows, asked once each (an import
# of torch costs seconds of the lease): CUDA torch with NCCL (why not, if
# not), and with pytest and NumPy for the package's tests.
torch_why=$(LD_LIBRARY_PATH=$host_ld python3 -c 'import torch, torch.distributed as d; assert torch.cuda.is_available(), "CUDA not available to torch"; assert d.is_nccl_available(), "torch has no NCCL"' 2>&1) && torch_cuda=1 || torch_cuda=0
LD_LIBRARY_PATH=$host_ld python3 -c 'import torch, pytest, numpy; assert torch.cuda.is_available()' >/dev/null 2>&1 && torch_tests=1 || torch_tests=0

# PyTorch: what a user would pick instead (world size 1, NCCL backend).
name="PyTorch torch.distributed all_reduce (NCCL backend, world size 1), time per call"
if ((torch_cuda)); then
    run "$name" env LD_LIBRARY_PATH="$host_ld" python3 scripts/gpu_torch_allreduce.py
    if ((rc == 0)) && grep -q '^torch ' <<<"$out"; then
        fig=$(grep '^torch ' <<<"$out" | awk '{ printf "%s%s B: %s us", sep, $2, $3; sep = "; " }')
        row "$name" pass "$fig ($(grep -m1 '^torch-version' <<<"$out" | cut -d' ' -f2-))"
    else
        row "$name" fail "rc $rc: $(tail -n 3 <<<"$out" | tr '\n' ' ' | cut -c1-300)"
    fi
else
    row "$name" skip "no CUDA-capable torch here: $(tail -n1 <<<"$torch_why" | cut -c1-200)"
fi

# The Python package on PyTorch CUDA tensors: DLPack, the caller's current
# stream, the device plane through NCCL at world size 1 (python/tests/
# test_cuda.py, as CI runs it on the emulators). The bundle's wheel goes into
# a directory of the report, not into python3's environment.
name="Python package on PyTorch CUDA tensors (DLPack, current stream; test_cuda.py, world size 1)"
wheel=$(ls "${pre:-/nonexistent}"/wheels/rankmesh-*.whl 2>/dev/null | head -n1)
if [[ -z $wheel ]]; then
    row "$name" skip "no wheel (RANKMESH_PREBUILT from scripts/gpu-bundle.sh carries one)"
elif ((!torch_tests)); then
    row "$name" skip "no CUDA-capable torch (or pytest, numpy) for python3 here"
else
    python3 -m pip install -q --no-deps --no-index --target "$report/py" "$wheel" >>"$log" 2>&1
    run "$name" env PYTHONPATH="$report/py" RANKMESH_TEST_CUDA=torch RANKMESH_NCCL_FOR_ONE=1 \
        python3 -m pytest -q -p no:cacheprovider --color=no python/tests/test_cuda.py
    if ((rc == 0)); then
        row "$name" pass "$(grep -E '[0-9]+ passed' <<<"$out" | tail -n1)"
    else
        row "$name" fail "rc $rc: $(grep -E 'Error|assert|failed' <<<"$out" | head -n 3 | tr '\n' ' ' | cut -c1-300)"
    fi
fi

# ---- several ranks on the one GPU (issue #64) ----
# A lease has one GPU. NCCL refuses two ranks of one communicator on one GPU
# of one host, and its host is its host hash, which NCCL_HOSTID sets:
# RANKMESH_SHARE_GPU=1 gives each rank its own, so NCCL moves their data
# through its network transport (sockets on loopback), as between nodes:
# real device memory, kernels, proxies, streams and bootstrap, slowly. These
# rows are for correctness and the life cycle, not speed. The whole check
# keeps to GPU_CHECK_BUDGET seconds (default 450, inside a lease's 8
# minutes): a row that would start past its share is skipped, saying so.
budget=${GPU_CHECK_BUDGET:-450}
multi_limit=${GPU_CHECK_MULTI_LIMIT:-90}
# `in_budget NAME RESERVE`: whether NAME may start with RESERVE seconds of
# the budget kept for what follows; else a skip row.
in_budget() {
    local used=$(($(date +%s) - started))
    if ((used + $2 > budget)); then
        row "$1" skip "not started: $used s of the check's $budget s budget used (GPU_CHECK_BUDGET), $2 s kept for the rows after it"
        return 1
    fi
}
export RANKMESH_SHARE_GPU=1 NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
shared=("${mpi[@]}" -x RANKMESH_SHARE_GPU -x NCCL_SOCKET_IFNAME -x NCCL_DEBUG)
# Long rows run under their own limit, restored after.
run_multi() { local keep=$step_limit; step_limit=$multi_limit; run "$@"; step_limit=$keep; }
# `worker_row NP MODE`: every device op against the host plane at NP ranks.
worker_row() {
    local np=$1 mode=$2
    local name="np $np on one GPU: every device op vs the host plane, all dtypes, random data vs float64, RANKMESH_CHECK=$mode"
    in_budget "$name" 150 || return 0
    RANKMESH_GPU_WORKER=1 RANKMESH_CHECK=$mode \
        run_multi "$name" "${shared[@]}" -np "$np" -x RANKMESH_GPU_WORKER -x RANKMESH_CHECK "$gpu_test"
    local oks ranks_ok
    oks=$(grep -c ': ok ' <<<"$out")
    ranks_ok=$(grep -c ', 0 checks failed' <<<"$out")
    if ((rc == 0)) && ((ranks_ok == np)); then
        row "$name" pass "$oks checks ok on $np ranks in $secs s"
    else
        row "$name" fail "rc $rc, $ranks_ok of $np ranks clean, $secs s: $(first_failure)"
    fi
}
for np in 2 3 4; do worker_row "$np" deferred; done

name="np 4 on one GPU: non-blocking creation, ncclCommSplit per group, FastVideo tp=2 sp=2, all_to_all_4d both ways on SP"
if in_budget "$name" 140; then
    NCCL_DEBUG=INFO RANKMESH_GPU_SPLIT_CHECK=1 \
        run_multi "$name" "${shared[@]}" -np 4 -x RANKMESH_GPU_SPLIT_CHECK -x NCCL_DEBUG_SUBSYS -x RANKMESH_EMU_COUNTS "$gpu_test"
    live=$(live_check); live_ok=$?
    oks=$(grep -c '^SPLIT-OK' <<<"$out")
    a2a=$(grep -c '^SPLIT-A2A4D' <<<"$out")
    if ((rc == 0)) && ((oks == 4 && a2a == 4)) && ((live_ok == 0)); then
        row "$name" pass "4 ranks: $(grep -m1 '^SPLIT-OK' <<<"$out" | sed 's/SPLIT-OK //'); all_to_all_4d ok on $a2a ranks; $live; $secs s"
    else
        row "$name" fail "rc $rc, SPLIT-OK on $oks and all_to_all_4d on $a2a of 4; $live; $(grep -m1 -E 'SPLIT-FAILED|error|panicked' <<<"$out" | cut -c1-300)"
    fi
fi

# Faults at np 2: each named within seconds, the job ended, no hang.
# `fault_row FAULT MODE TIMEOUT NAME`
fault_row() {
    local fault=$1 mode=$2 timeout=$3 name=$4
    in_budget "$name" 130 || return 0
    RANKMESH_GPU_FAULT=$fault RANKMESH_CHECK=$mode RANKMESH_TIMEOUT=$timeout \
        run_multi "$name" "${shared[@]}" -np 2 -x RANKMESH_GPU_FAULT -x RANKMESH_CHECK -x RANKMESH_TIMEOUT "$gpu_test"
    local named ok=0
    named=$(grep -c '^FAULT-NAMED' <<<"$out")
    case $fault in
        mismatch) ((named == 2)) && (($(grep -c '^FAULT-NAMED rank [01]: .*ranks disagree' <<<"$out") == 2)) && ok=1 ;;
        # The launcher may end the job at the death before rank 0 prints.
        kill) { grep -q '^FAULT-NAMED rank 0' <<<"$out" || grep -q 'signal 9' <<<"$out"; } && ok=1 ;;
        stop) { grep -q 'group rank 1 (world rank 1, .*process stopped' <<<"$out" || grep -q '^FAULT-NAMED rank 0' <<<"$out"; } && ok=1 ;;
    esac
    # A hang would stop at the step limit, past the time allowed here.
    ((rc == 0)) && ok=0
    if ((ok)) && awk -v s="$secs" -v t="$timeout" 'BEGIN { exit !(s < t + 25) }'; then
        row "$name" pass "ended after $secs s (rc $rc): $(grep -m1 -E '^FAULT-NAMED rank 0|process stopped|signal 9' <<<"$out" | cut -c1-240)"
    else
        row "$name" fail "rc $rc after $secs s, $named ranks named it: $(grep -m1 -E '^FAULT|error|stopped at|signal' <<<"$out" | cut -c1-300)"
    fi
}
fault_row mismatch strict 30 "np 2 on one GPU: a mismatched device all_reduce in strict mode, named on both ranks"
fault_row kill deferred 10 "np 2 on one GPU: a rank kill -9ed inside device all_reduces, the job ended and the death named"
fault_row stop deferred 5 "np 2 on one GPU: a rank SIGSTOPped inside device all_reduces (RANKMESH_TIMEOUT=5), named as stopped"

# The Python package on torch CUDA tensors, FastVideo's names.
for np in 2 4; do
    name="np $np on one GPU: Python package on PyTorch CUDA tensors (test_cuda.py)"
    if [[ -z ${wheel:-} ]]; then
        row "$name" skip "no wheel (RANKMESH_PREBUILT from scripts/gpu-bundle.sh carries one)"
    elif ((!torch_tests)); then
        row "$name" skip "no CUDA-capable torch (or pytest, numpy) for python3 here"
    elif in_budget "$name" 110; then
        run_multi "$name" "${shared[@]}" -np "$np" -x PYTHONPATH="$report/py" -x RANKMESH_TEST_CUDA=torch \
            python3 -m pytest -q -p no:cacheprovider --color=no python/tests/test_cuda.py
        if ((rc == 0)); then
            row "$name" pass "$(grep -E '[0-9]+ passed' <<<"$out" | sort | uniq -c | tr -s ' ' | head -n 2 | tr '\n' ';')"
        else
            row "$name" fail "rc $rc: $(grep -E 'Error|assert|failed' <<<"$out" | head -n 3 | tr '\n' ' ' | cut -c1-300)"
        fi
    fi
done

# The CLI, validated, in nccl-tests' format.
declare -A rm_small
for np in 2 4; do
    name="np $np on one GPU: rankmesh bench all_reduce --backend nccl -c 1, validated (nccl-tests format)"
    in_budget "$name" 100 || continue
    run_multi "$name" "${shared[@]}" -np "$np" "$bin" bench all_reduce --backend nccl -b 8 -e 1M -f 8 -n 200 -w 20 -c 1
    warned=$(grep -c 'RANKMESH_SHARE_GPU=1: ranks may share a GPU' <<<"$out")
    if ((rc == 0)) && grep -q 'Out of bounds values : 0 OK' <<<"$out" && grep -q '# Avg bus bandwidth' <<<"$out" && ((warned == 1)); then
        # nccl-tests rows: size count type redop root time algbw busbw #wrong ...
        fig=$(awk '$1 ~ /^[0-9]+$/ && NF >= 12 { printf "%s%s B: %s us", sep, $1, $6; sep = "; " }' <<<"$out")
        ((np == 2)) && while read -r sz t; do rm_small[$sz]=$t; done < <(awk '$1 ~ /^[0-9]+$/ && NF >= 12 { print $1, $6 }' <<<"$out")
        row "$name" pass "0 wrong; the shared-GPU warning once; $fig"
    else
        row "$name" fail "rc $rc, warning printed $warned times: $(first_failure)"
    fi
done

# reduce_scatter_v on NCCL: one group of ncclReduce calls (each block moves
# once) against the padded ncclReduceScatter it replaces, which is
# reduce_scatter at the padded size: at --skew 1 on 2 ranks the longest
# block is the whole, so the padded call moves twice the bytes. Both
# validated; the socket transport between ranks of one GPU makes this
# indicative, not a speed target (issue #63).
name="np 2 on one GPU: reduce_scatter_v (grouped ncclReduce) against a padded ncclReduceScatter, --skew 1, 1-16 MiB"
if in_budget "$name" 60; then
    run_multi "$name" "${shared[@]}" -np 2 "$bin" bench reduce_scatter_v --backend nccl -b 1M -e 16M -f 4 -n 20 -w 3 -c 1 --skew 1
    rsv_out=$out rsv_rc=$rc
    run_multi "$name" "${shared[@]}" -np 2 "$bin" bench reduce_scatter --backend nccl -b 2M -e 32M -f 4 -n 20 -w 3 -c 1
    if ((rsv_rc == 0 && rc == 0)) && grep -q 'Out of bounds values : 0 OK' <<<"$rsv_out" && grep -q 'Out of bounds values : 0 OK' <<<"$out"; then
        # nccl-tests rows: size count type redop root time ...; padded = 2 x size.
        fig=$(awk 'NR == FNR { if ($1 ~ /^[0-9]+$/ && NF >= 12) padded[$1 / 2] = $6; next }
                   $1 ~ /^[0-9]+$/ && NF >= 12 { printf "%s%s B: grouped %s us, padded %s us", sep, $1, $6, padded[$1]; sep = "; " }' \
                  <(printf '%s\n' "$out") <(printf '%s\n' "$rsv_out"))
        row "$name" info "0 wrong; $fig (socket transport: indicative)"
    else
        row "$name" fail "rc $rsv_rc/$rc: $(first_failure)"
    fi
fi

# The anchor: torch.distributed on NCCL, same GPU, same NCCL_HOSTID rule.
name="np 2 on one GPU: torch.distributed NCCL all_reduce against rankmesh's, time per call, 8 B-1 MiB"
if ((!torch_cuda)); then
    row "$name" skip "no CUDA-capable torch here: $(tail -n1 <<<"$torch_why" | cut -c1-200)"
elif in_budget "$name" 100; then
    run_multi "$name" "$mpirun_bin" --oversubscribe --bind-to none -np 2 -x NCCL_SOCKET_IFNAME -x LD_LIBRARY_PATH="$host_ld" \
        -x PATH python3 scripts/gpu_torch_allreduce.py
    if ((rc == 0)) && grep -q '^torch ' <<<"$out"; then
        fig=$(grep '^torch ' <<<"$out" | while read -r _ sz t; do printf '%s B: torch %s us, rankmesh %s us; ' "$sz" "$t" "${rm_small[$sz]:-?}"; done)
        row "$name" info "${fig}($(grep -m1 '^torch-version' <<<"$out" | cut -d' ' -f2-); socket transport, not a speed target)"
    else
        row "$name" fail "rc $rc: $(tail -n 3 <<<"$out" | tr '\n' ' ' | cut -c1-300)"
    fi
fi

# torch.distributed on the "rankmesh" backend with CUDA tensors (issue #68):
# its C++ backend is built here first (the host's C++ compiler, Python's
# headers and torch's), into the report.
name="np 2 on one GPU: torch.distributed on the rankmesh backend, CUDA tensors: 7 ops vs float64, DDP bit-identical"
if [[ -z ${wheel:-} ]] || ((!torch_cuda)); then
    row "$name" skip "no wheel, or no CUDA-capable torch for python3 here"
elif ! command -v "${CXX:-c++}" >/dev/null || ! python3 -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
    row "$name" skip "no C++ compiler (${CXX:-c++}) or no Python.h here: the backend is built on the host"
elif in_budget "$name" 130; then
    export RANKMESH_TORCH_CACHE=$report/torch-cache
    run "build of the rankmesh torch backend" "${mpi[@]}" -np 1 -x PYTHONPATH="$report/py" -x RANKMESH_TORCH_CACHE \
        python3 -m rankmesh.torch
    if ((rc != 0)); then
        row "$name" fail "the backend did not build: $(tail -n 3 <<<"$out" | tr '\n' ' ' | cut -c1-300)"
    else
        run_multi "$name" "${shared[@]}" -np 2 -x PYTHONPATH="$report/py" -x RANKMESH_TORCH_CACHE \
            python3 scripts/gpu_torch_rankmesh.py
        oks=$(grep -c '^TORCH-RANKMESH-OK' <<<"$out")
        if ((rc == 0 && oks == 2)); then
            row "$name" pass "both ranks: $(grep -m1 '^TORCH-RANKMESH-OK' <<<"$out" | cut -d: -f2-); $secs s"
        else
            row "$name" fail "rc $rc, $oks of 2 ranks ok: $(grep -E 'Error|assert' <<<"$out" | head -n 2 | tr '\n' ' ' | cut -c1-300)"
        fi
    fi
fi

# The other check modes, as the budget allows.
for np in 2 4 3; do
    for mode in strict off; do worker_row "$np" "$mode"; done
done
unset RANKMESH_SHARE_GPU

# ---- the host plane at 2-16 ranks on the lease's cores (last) ----
# rankmesh bench with its raw-MPI baseline (the bundle's Open MPI at its
# defaults, run in the same process), one rank per core where the cores
# allow, 3 runs alternating world sizes and ops; medians. The full table
# is REPORT_DIR/host-scaling.md; the rows give raw/rankmesh per op.
cores=$(nproc)
host_nps=${GPU_CHECK_HOST_NPS:-2 4 8 16}
host_sizes=(${GPU_CHECK_HOST_SIZES:--b 64 -e 64M -f 32})
host_ops="all_reduce all_gather broadcast alltoall all_to_all_4d"
host_rounds=${GPU_CHECK_HOST_ROUNDS:-3}
scale=$report/host-scaling.tsv
: >"$scale"
placed() { # mpirun's placement for NP ranks: a core each where they fit
    if (($1 <= cores)); then echo --bind-to core --map-by core; else echo --oversubscribe --bind-to none; fi
}
host_name="host plane at np ${host_nps// /, }: rankmesh bench vs raw MPI (Open MPI defaults), medians of $host_rounds"
if in_budget "$host_name" 30; then
    for round in $(seq "$host_rounds"); do
        for np in $host_nps; do
            for op in $host_ops; do
                (($(date +%s) - started > budget)) && break 3
                # shellcheck disable=SC2046
                run "host $op np $np round $round" "$mpirun_bin" $(placed "$np") "${forward[@]}" -np "$np" \
                    "$bin" bench "$op" "${host_sizes[@]}" -n 20 -w 3 -c 1 --backend host --baseline mpi
                if ((rc != 0)); then
                    echo -e "$np\t$op\tFAILED\t$(first_failure)" >>"$scale"
                    continue
                fi
                baseline_rows | awk -v np="$np" -v op="$op" '{ print np "\t" op "\t" $2 "\t" $3 "\t" $5 }' >>"$scale"
            done
        done
    done
    python3 - "$scale" "$report/host-scaling.md" "$cores" <<'PY' >"$report/host-rows.tsv"
import collections, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
failed = [r for r in rows if r[2] == "FAILED"]
t = collections.defaultdict(list)
for r in rows:
    if r[2] != "FAILED":
        t[(int(r[0]), r[1], int(r[2]))].append((float(r[3]), float(r[4])))
with open(sys.argv[2], "w") as md:
    md.write(f"# Host plane, rankmesh vs raw MPI ({sys.argv[3]} cores; medians of the runs)\n\n")
    md.write("| np | op | bytes | rankmesh us | raw MPI us | raw / rankmesh | runs |\n|---|---|---|---|---|---|---|\n")
    for (np, op, size), v in sorted(t.items()):
        a = statistics.median(x for x, _ in v); b = statistics.median(y for _, y in v)
        md.write(f"| {np} | {op} | {size} | {a:.2f} | {b:.2f} | {b / a:.2f} | {len(v)} |\n")
nps = sorted({k[0] for k in t})
for np in nps:
    parts = []
    for op in ["all_reduce", "all_gather", "broadcast", "alltoall", "all_to_all_4d"]:
        sizes = sorted(s for (n, o, s) in t if n == np and o == op)
        if sizes:
            r = [statistics.median(y for _, y in t[(np, op, s)]) / statistics.median(x for x, _ in t[(np, op, s)]) for s in sizes]
            parts.append(f"{op} " + "/".join(f"{x:.2f}" for x in r))
    runs = sorted({len(v) for k, v in t.items() if k[0] == np})
    print(f"np {np}\tinfo\traw/rankmesh at {'/'.join(str(s) for s in sorted({k[2] for k in t if k[0] == np}))} B: " + "; ".join(parts)
          + f" ({'-'.join(map(str, (runs[0], runs[-1]) if len(runs) > 1 else runs))} runs per cell)")
for r in failed:
    print(f"np {r[0]} {r[1]}\tfail\t{r[3]}")
PY
    while IFS=$'\t' read -r n s d; do
        row "$host_name: $n" "$s" "$d"
    done <"$report/host-rows.tsv"
    rm -f "$report/host-rows.tsv"
fi

# Start-up: `rankmesh topo` against MPI_Init + node split + split + barrier.
startup=${pre:-target}/mpi_startup
name="start-up at np ${GPU_CHECK_STARTUP_NPS:-16 64}: mpirun of rankmesh topo vs raw MPI_Init + splits + barrier, medians of $host_rounds"
if [[ ! -x $startup ]]; then
    row "$name" skip "no $startup (scripts/gpu-bundle.sh builds it with mpicc)"
elif in_budget "$name" 0; then
    declare -A st
    for round in $(seq "$host_rounds"); do
        for np in ${GPU_CHECK_STARTUP_NPS:-16 64}; do
            for prog in rankmesh raw; do
                if [[ $prog == raw ]]; then cmd=("$startup"); else cmd=("$bin" topo); fi
                # shellcheck disable=SC2046
                run "start-up $prog np $np" "$mpirun_bin" $(placed "$np") "${forward[@]}" -np "$np" "${cmd[@]}"
                ((rc == 0)) && st[$np,$prog]+="$secs " || st[$np,failed]+="$prog rc $rc "
            done
        done
    done
    fig=""; ok=1
    for np in ${GPU_CHECK_STARTUP_NPS:-16 64}; do
        [[ -n ${st[$np,failed]:-} ]] && { ok=0; fig+="np $np: ${st[$np,failed]}; "; continue; }
        a=$(tr ' ' '\n' <<<"${st[$np,rankmesh]}" | grep . | median)
        b=$(tr ' ' '\n' <<<"${st[$np,raw]}" | grep . | median)
        fig+="np $np: rankmesh topo $a s, raw $b s; "
    done
    if ((ok)); then row "$name" info "${fig}(whole launches)"; else row "$name" fail "$fig"; fi
fi

# ---- the report ----
total=$(($(date +%s) - started))
failed=$(awk -F'\t' '$2 == "fail"' "$rows" | wc -l)
passed=$(awk -F'\t' '$2 == "pass"' "$rows" | wc -l)
skipped=$(awk -F'\t' '$2 == "skip" || $2 == "info"' "$rows" | wc -l)
# A GPU host may have no git: the bundle records the commit it was built from.
if [[ -n "${pre:-}" && -f $pre/BUNDLE ]]; then
    rev=$(head -n1 "$pre/BUNDLE" | cut -d' ' -f2 | tr -d ',')
else
    rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
fi
{
    echo "# rankmesh GPU check"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); rankmesh $rev; $total s"
    echo "- GPU: ${gpu_name:-none} x $ngpu; driver ${driver:-?}; CUDA ${cuda:-?}"
    echo "- NCCL: ${nccl_version:-not loaded} (${nccl_path:-?})"
    echo "- $passed passed, $failed failed, $skipped skipped"
    echo
    echo "| check | result | reason or figure |"
    echo "|---|---|---|"
    awk -F'\t' '{ gsub(/\|/, "\\|", $3); printf "| %s | %s | %s |\n", $1, $2, $3 }' "$rows"
} >"$report/gpu-report.md"
json_str() { sed 's/\\/\\\\/g; s/"/\\"/g' <<<"$1" | tr -d '\000-\037' | sed 's/^/"/; s/$/"/'; }
{
    printf '{"date":%s,"rankmesh":%s,"seconds":%d,' "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(json_str "$rev")" "$total"
    printf '"gpu":%s,"gpus":%d,"driver":%s,"cuda":%s,' "$(json_str "$gpu_name")" "$ngpu" "$(json_str "$driver")" "$(json_str "$cuda")"
    printf '"nccl":{"version":%s,"path":%s},' "$(json_str "$nccl_version")" "$(json_str "$nccl_path")"
    printf '"passed":%d,"failed":%d,"skipped":%d,"checks":[' "$passed" "$failed" "$skipped"
    sep=""
    while IFS=$'\t' read -r n s d; do
        printf '%s{"check":%s,"result":%s,"detail":%s}' "$sep" "$(json_str "$n")" "$(json_str "$s")" "$(json_str "$d")"
        sep=","
    done <"$rows"
    printf ']}\n'
} >"$report/gpu-report.json"
rm -f "$rows"
echo "gpu-check: $passed passed, $failed failed, $skipped skipped in $total s; report in $report/gpu-report.md"
((failed == 0))
