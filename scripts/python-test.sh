#!/usr/bin/env bash
# The Python package (issue #50): builds python/ into a virtual environment
# (maturin, NumPy, ml_dtypes and pytest from PyPI), writes rankmesh's own
# `topo --json` for every TP/SP layout of 1-4 ranks, then runs pytest under
# mpirun at np 1-4 (every rank runs every test against a NumPy reference),
# the CUDA tests on the emulators, the tests again under MPICH, and whole jobs;
# then torch.distributed on the "rankmesh" backend (python/torch_tests, torch
# from PyPI: about 4.3 GB with its CUDA packages, once per venv) at np 1-4,
# and under MPICH.
# Needs python3-venv and python3-dev (scripts/install-deps.sh --test).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
venv=${RANKMESH_PY_VENV:-target/python-venv}
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
# No cache: torch's wheels would stay there, a second 3 GB.
"$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "maturin>=1.5,<2" numpy pytest ml_dtypes \
  "torch==2.11.0"
# The torch backend's C++ library, built by the first rank that imports
# rankmesh.torch (the others wait on its lock), kept with the build.
export RANKMESH_TORCH_CACHE="$PWD/target/torch-backend"
PATH="$PWD/$venv/bin:$PATH" CARGO_TARGET_DIR="$PWD/target/python" \
  pip install -q --disable-pip-version-check --no-build-isolation ./python
cargo build -q --bin rankmesh
# pytest with the skip rule (python/testing/ci_skips.py: each skip says why;
# under CI one fails unless tests/allowed-skips.txt lists it).
export PYTHONPATH="$PWD/python/testing${PYTHONPATH:+:$PYTHONPATH}"
pytest=("$venv/bin/python" -m pytest -q -rs -p no:cacheprovider --color=no -p ci_skips)
topo=$(mktemp -d)
trap 'rm -rf "$topo"' EXIT
for w in 1 2 3 4; do
  for tp in 1 2 3 4; do
    for sp in 1 2 3 4; do
      if (( w % tp == 0 && w % sp == 0 )); then
        timeout 120 mpirun --oversubscribe -np "$w" target/debug/rankmesh topo --json --tp "$tp" --sp "$sp" \
          > "$topo/topo-$w-$tp-$sp.json"
      fi
    done
  done
done
meshes=([1]="tp=1:" [2]="dp=2,tp=1: tp=2,dp=1:tp-dp" [3]="pp=3,tp=1:" [4]="pp=2,tp=2: dp=2,tp=2:tp-dp pp=2,dp=2:dp-pp")
for w in 1 2 3 4; do
  for m in ${meshes[$w]}; do
    spec=${m%%:*} order=${m#*:}
    timeout 120 mpirun --oversubscribe -np "$w" target/debug/rankmesh topo --json --mesh "$spec" \
      ${order:+--order "$order"} > "$topo/mesh-$w-$spec-${order:-None}.json"
  done
done
for np in 1 2 3 4; do
  echo "python-test: pytest under mpirun -np $np" >&2
  RANKMESH_TOPO_DIR="$topo" timeout 600 mpirun --oversubscribe -np "$np" \
    "${pytest[@]}" python/tests --ignore=python/tests/test_cuda.py
done
# CUDA tensors through DLPack on the device plane, on the CUDA and NCCL
# emulators (tests/emulator; built by the gpu test binary), np 1-3.
cargo build -q --test gpu
gpu_test=$(ls -t target/debug/deps/gpu-* | grep -v '\.d$' | head -n1)
emu="$topo/emu"
RANKMESH_EMU_BUILD="$emu" "$gpu_test" >/dev/null
for np in 1 2 3; do
  echo "python-test: CUDA tensors on the emulators, mpirun -np $np" >&2
  LD_LIBRARY_PATH="$emu" RANKMESH_NCCL_LIB="$emu/libnccl.so.2" RANKMESH_EMU_GPUS=4 \
    RANKMESH_TEST_CUDA=emulator timeout 600 mpirun --oversubscribe -np "$np" \
    -x LD_LIBRARY_PATH -x RANKMESH_NCCL_LIB -x RANKMESH_EMU_GPUS -x RANKMESH_TEST_CUDA \
    "${pytest[@]}" python/tests/test_cuda.py
done
# The same tests under Debian's MPICH: the package built against it (its own
# target directory and install directory), launched by its hydra.
PATH="$PWD/$venv/bin:$PATH" MPICC=mpicc.mpich CARGO_TARGET_DIR="$PWD/target/python-mpich" \
  pip install -q --disable-pip-version-check --no-build-isolation --upgrade \
  --target target/python-mpich-site ./python
for np in 2 3; do
  echo "python-test: pytest under MPICH's mpiexec -n $np" >&2
  RANKMESH_TOPO_DIR="$topo" PYTHONPATH="$PWD/target/python-mpich-site:$PYTHONPATH" timeout 600 \
    mpiexec.mpich -n "$np" "${pytest[@]}" python/tests --ignore=python/tests/test_cuda.py
done
for np in 1 2 3 4; do
  echo "python-test: torch.distributed on rankmesh, mpirun -np $np" >&2
  timeout 600 mpirun --oversubscribe -np "$np" "${pytest[@]}" python/torch_tests
done
echo "python-test: torch.distributed on rankmesh under MPICH's mpiexec -n 2" >&2
PYTHONPATH="$PWD/target/python-mpich-site:$PYTHONPATH" timeout 600 mpiexec.mpich -n 2 "${pytest[@]}" \
  python/torch_tests
echo "python-test: whole jobs (python/jobs, launching mpirun itself)" >&2
timeout 600 "${pytest[@]}" python/jobs
timeout 120 mpirun --oversubscribe -np 4 "$venv/bin/python" examples/python/sp_attention.py
timeout 300 mpirun --oversubscribe -np 4 "$venv/bin/python" examples/python/torch_ddp.py
