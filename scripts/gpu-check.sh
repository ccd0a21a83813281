#!/usr/bin/env bash
# One command for the GPU data plane on a CUDA machine: build, run the device
# test program (single-rank communicators, then one rank per GPU under
# mpirun when there are at least two GPUs), then a short NCCL benchmark with
# the raw-NCCL baseline (the issue's targets: +time at 8 B, busbw ratio at
# >= 64 MiB).
#
#   bash scripts/gpu-check.sh              # build with cargo, then run
#   RANKMESH_PREBUILT=dir bash scripts/gpu-check.sh
#       # a host without Rust: dir holds `rankmesh` and `gpu` (the test
#       # binary), built elsewhere (docs/GPU.md shows how), and optionally
#       # `mpiroot/` with Open MPI's runtime unpacked from Debian packages.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo

if [[ -n "${RANKMESH_PREBUILT:-}" ]]; then
    bin=$RANKMESH_PREBUILT/rankmesh
    gpu_test=$RANKMESH_PREBUILT/gpu
    if [[ -d $RANKMESH_PREBUILT/mpiroot ]]; then
        root=$(cd "$RANKMESH_PREBUILT/mpiroot" && pwd)
        export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        export OPAL_PREFIX=$root/usr PMIX_INSTALL_PREFIX=$root/usr/lib/x86_64-linux-gnu/pmix2
        export PATH=$root/usr/bin:$PATH
    fi
else
    cargo build --release --bin rankmesh --test gpu
    bin=target/release/rankmesh
    gpu_test=$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -n1)
fi
mpirun_bin=$(command -v mpirun.openmpi || command -v mpirun)
# Forward the variables the ranks need, those that are set.
forward=()
for v in LD_LIBRARY_PATH OPAL_PREFIX PMIX_INSTALL_PREFIX RANKMESH_NCCL_LIB RANKMESH_DEVICE CUDA_VISIBLE_DEVICES; do
    [[ -n "${!v:-}" ]] && forward+=(-x "$v")
done
run_np() {
    local np=$1; shift
    "$mpirun_bin" -np "$np" --oversubscribe --bind-to none "${forward[@]}" "$@"
}

echo "== devices"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader || true
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "== topo"
"$bin" topo

# RANKMESH_GPU_WORKER=1: the test binary runs the checks as a rank (without
# it, it is cargo's driver that also runs the CI emulator trials). They
# include caller-owned cudarc buffers as views on a caller stream, in each
# check mode (deferred is the default).
export RANKMESH_GPU_WORKER=1
for mode in deferred strict off; do
    echo "== device tests, 1 rank, RANKMESH_CHECK=$mode"
    RANKMESH_CHECK=$mode "$gpu_test"
    if (( ngpu >= 2 )); then
        echo "== device tests, $ngpu ranks (one per GPU), RANKMESH_CHECK=$mode"
        RANKMESH_CHECK=$mode run_np "$ngpu" -x RANKMESH_GPU_WORKER -x RANKMESH_CHECK "$gpu_test"
    fi
done
unset RANKMESH_GPU_WORKER
if (( ngpu >= 2 )); then
    echo "== deferred agreement: a mismatch is the same error at synchronize on every rank"
    run_np 2 -x RANKMESH_GPU_DEFERRED_MISMATCH=1 "$gpu_test"
fi

np=$(( ngpu >= 2 ? ngpu : 1 ))
for mode in strict deferred off strict deferred off strict deferred off; do
    echo "== bench: all_reduce latency, $np rank(s), vs raw NCCL, RANKMESH_CHECK=$mode"
    RANKMESH_CHECK=$mode run_np "$np" -x RANKMESH_CHECK "$bin" bench all_reduce -b 8 -e 4K -f 8 -n 2000 -w 200 -c 1 --backend nccl --baseline nccl
done
echo "== bench: all_reduce bandwidth, $np rank(s), vs raw NCCL"
run_np "$np" "$bin" bench all_reduce -b 64M -e 512M -f 2 -n 50 -w 5 -c 1 --backend nccl --baseline nccl
for op in all_gather reduce_scatter broadcast alltoall sendrecv all_to_all_4d; do
    echo "== bench: $op, $np rank(s), validated"
    run_np "$np" "$bin" bench "$op" -b 8K -e 64M -f 64 -n 20 -w 2 -c 1 -d bfloat16 --backend nccl --baseline nccl
done
echo "gpu-check: done"
