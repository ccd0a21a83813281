#!/usr/bin/env bash
# Fetches NCCL's real library and headers, and CUDA's driver header, from
# PyPI wheels into .cache/nccl (git-ignored, reused between runs): the
# nvidia-nccl-cu12 wheel holds nvidia/nccl/lib/libnccl.so.2 and
# nvidia/nccl/include/nccl.h, nvidia-cuda-runtime-cu12 holds
# nvidia/cuda_runtime/include/cuda.h. Both load or compile without a GPU;
# the tests use them to hold rankmesh to the real library (docs/GPU.md).
# Prints the library's path. Offline, it says so and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.cache/nccl
lib="$cache/nvidia/nccl/lib/libnccl.so.2"
if [[ -e "$lib" && -e "$cache/nvidia/cuda_runtime/include/cuda.h" ]]; then
  echo "$lib"
  exit 0
fi
pip=$(command -v pip3 || command -v pip || true)
if [[ -z "$pip" ]]; then
  echo "fetch-nccl: pip is missing (install python3-pip)" >&2
  exit 1
fi
mkdir -p "$cache/wheels"
for wheel in nvidia-nccl-cu12==2.32.3 nvidia-cuda-runtime-cu12==12.9.79; do
  if ! "$pip" download --quiet --no-deps --disable-pip-version-check -d "$cache/wheels" "$wheel" >&2; then
    echo "fetch-nccl: cannot download $wheel (offline?)" >&2
    exit 1
  fi
done
for w in "$cache"/wheels/*.whl; do
  python3 -m zipfile -e "$w" "$cache"
done
rm -rf "$cache/wheels"
echo "$lib"
