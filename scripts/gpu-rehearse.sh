#!/usr/bin/env bash
# The GPU check's rehearsal without a GPU (a CI step of scripts/test.sh):
# builds the bundle exactly as for a GPU machine (scripts/gpu-bundle.sh), then
# runs scripts/gpu-check.sh from it end to end against the CUDA and NCCL
# emulators (tests/emulator/) and a stand-in nvidia-smi, one emulated GPU
# shared by every process as on a one-GPU machine. Fails when the script,
# the bundle or any check breaks; the speed rows are recorded without their
# targets (host memory is no GPU) and the rows that need PyTorch are skipped
# with their reason. The multi-rank rows run at the lease's world sizes
# (np 2-4 on the one emulated GPU); the host-plane table at np 2 and 4. The report lands in REPORT_DIR (default target/gpu-rehearsal).
set -euo pipefail
cd "$(dirname "$0")/.."
report=${1:-target/gpu-rehearsal}
bundle=target/gpu-rehearsal-bundle
bash scripts/gpu-bundle.sh "$bundle" >/dev/null
emu=$(pwd)/target/gpu-rehearsal-emulators
RANKMESH_EMU_BUILD=$emu "$bundle/gpu"
export LD_LIBRARY_PATH=$emu RANKMESH_NCCL_LIB=$emu/libnccl.so.2
export RANKMESH_EMU_GPUS=1 RANKMESH_EMU_BUS=0000:3B:00.0 RANKMESH_EMU_ASYNC=0
export PATH=$(pwd)/tests/emulator/bin:$PATH
export GPU_CHECK_TARGETS="off (rehearsal on the emulators)" GPU_CHECK_LARGE=64M
# Every row runs here, however slow this machine: the budget is the lease's.
# The host plane at world sizes this machine's cores can take, small sizes.
export GPU_CHECK_BUDGET=100000 GPU_CHECK_HOST_NPS="2 4" GPU_CHECK_STARTUP_NPS="2 4"
export GPU_CHECK_HOST_SIZES="-b 64 -e 64K -f 32" GPU_CHECK_HOST_ROUNDS=1
unset CUDA_VISIBLE_DEVICES RANKMESH_DEVICE
status=0
RANKMESH_PREBUILT=$bundle bash scripts/gpu-check.sh "$report" || status=$?
# Beyond its exit status: both reports written, every row there, and only
# the rows that need a GPU not passed.
rows=$(grep -c '^| .* | \(pass\|fail\|skip\|info\) |' "$report/gpu-report.md" || true)
unexpected=$(grep '^| .* | \(fail\|skip\) |' "$report/gpu-report.md" | grep -v 'PyTorch\|torch.distributed' || true)
# The multi-rank rows (issue #64) and the host-plane rows among them.
multi=$(grep -c '^| np [234] on one GPU: .* | pass |' "$report/gpu-report.md" || true)
host=$(grep -c '^| host plane at np .*: np [24] | info |' "$report/gpu-report.md" || true)
if ((status != 0)) || ((rows < 40 || multi < 15 || host < 2)) || [[ -n $unexpected ]] || ! grep -q '"checks":\[{' "$report/gpu-report.json"; then
    cat "$report/gpu-report.md" >&2
    echo "gpu-rehearse: FAILED (exit $status, $rows rows, $multi multi-rank passes, $host host rows); log in $report/gpu-check.log" >&2
    exit 1
fi
echo "gpu-rehearse: ok ($rows rows; report in $report/gpu-report.md)"
