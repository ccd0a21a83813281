#!/usr/bin/env bash
# The GPU check's rehearsal without a GPU (a CI step of scripts/test.sh):
# builds the bundle exactly as for a GPU machine (scripts/gpu-bundle.sh), then
# runs scripts/gpu-check.sh from it end to end against the CUDA and NCCL
# emulators (tests/emulator/) and a stand-in nvidia-smi, one emulated GPU
# shared by every process as on a one-GPU machine. Fails when the script,
# the bundle or any check breaks; the speed rows are recorded without their
# targets (host memory is no GPU) and the PyTorch row is skipped with its
# reason. The report lands in REPORT_DIR (default target/gpu-rehearsal).
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
unset CUDA_VISIBLE_DEVICES RANKMESH_DEVICE
status=0
RANKMESH_PREBUILT=$bundle bash scripts/gpu-check.sh "$report" || status=$?
# Beyond its exit status: both reports written, every row there, and only
# the rows that need a GPU not passed.
rows=$(grep -c '^| .* | \(pass\|fail\|skip\|info\) |' "$report/gpu-report.md" || true)
unexpected=$(grep '^| .* | \(fail\|skip\) |' "$report/gpu-report.md" | grep -v 'PyTorch' || true)
if ((status != 0)) || ((rows < 20)) || [[ -n $unexpected ]] || ! grep -q '"checks":\[{' "$report/gpu-report.json"; then
    cat "$report/gpu-report.md" >&2
    echo "gpu-rehearse: FAILED (exit $status, $rows rows); log in $report/gpu-check.log" >&2
    exit 1
fi
echo "gpu-rehearse: ok ($rows rows; report in $report/gpu-report.md)"
