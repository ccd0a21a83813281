#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build and test rankmesh:
# Open MPI (library, headers, mpirun), hwloc and libudev (placement),
# libclang for rsmpi's bindgen, pkg-config;
# with --test also Slurm and munge for the local-cluster tests, pip for
# NCCL's real library (scripts/fetch-nccl.sh), and MPICH for the portability
# smoke (scripts/mpi-smoke.sh; the PyPI MPIs come through pip), valgrind and
# strace for the hot path's budget (scripts/hot-path-guard.sh).
# Does nothing when everything is present; needs root (or sudo) otherwise.
set -euo pipefail
need=()
if [ "${1:-}" = "--test" ]; then
  command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || need+=(munge)
  # pip fetches NCCL's real library for the tests (scripts/fetch-nccl.sh).
  command -v pip3 >/dev/null 2>&1 || command -v pip >/dev/null 2>&1 || need+=(python3-pip)
  # g++ compiles the NCCL header check (tests/nccl_abi.rs).
  command -v g++ >/dev/null 2>&1 || need+=(g++)
  # MPICH beside Open MPI for the portability smoke (scripts/mpi-smoke.sh);
  # Open MPI keeps the higher alternatives priority, so mpicc stays Open MPI's.
  command -v mpicc.mpich >/dev/null 2>&1 || need+=(mpich libmpich-dev)
  # The Python package's tests build it in a virtual environment (python/).
  dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
  dpkg -s python3-dev >/dev/null 2>&1 || need+=(python3-dev)
  # The hot path's budget counts instructions and system calls
  # (scripts/hot-path-guard.sh).
  command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
  command -v strace >/dev/null 2>&1 || need+=(strace)
fi
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || [ -e /usr/include/mpi.h ] \
  || dpkg -s libopenmpi-dev >/dev/null 2>&1 || need+=(libopenmpi-dev)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
dpkg -s libhwloc-dev >/dev/null 2>&1 || need+=(libhwloc-dev)
dpkg -s libudev-dev >/dev/null 2>&1 || need+=(libudev-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v cc >/dev/null 2>&1 || need+=(gcc)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing ${need[*]} and no apt-get; install them with your package manager" >&2
  exit 1
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${need[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (https://rustup.rs) first" >&2
  exit 1
fi
