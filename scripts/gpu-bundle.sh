#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a CUDA host that has no Rust
# toolchain and no MPI (such as a lent GPU machine) into DIR (git-ignored):
#   rankmesh, gpu        the release CLI and the device test binary
#   mpi_startup          the start-up row's raw-MPI baseline (scripts/mpi_startup.c)
#   wheels/              the Python package's abi3 wheel (maturin), for the
#                        check's PyTorch CUDA-tensor row
#   mpiroot/             Open MPI's runtime unpacked from Debian's packages
#   lib/                 every other shared library these need that is not
#                        glibc's own, copied from this machine, so nothing
#                        depends on this machine's paths or packages
#   BUNDLE               what went in, and from which commit
# NCCL is not packed: the CUDA host's own (its nvidia-nccl wheel) is used,
# and the check's report says which one loaded.
#
#   bash scripts/gpu-bundle.sh .gpu-bundle
#   # on the CUDA host, from the repository root:
#   RANKMESH_PREBUILT=.gpu-bundle bash scripts/gpu-check.sh gpu-report
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-bundle}
limit_mib=40
cargo build --release --bin rankmesh --test gpu
rm -rf "$dir"
mkdir -p "$dir/debs" "$dir/lib"
cp target/release/rankmesh "$dir/"
cp "$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -n1)" "$dir/gpu"
# The start-up row's raw-MPI baseline (MPI_Init, splits, a barrier).
mpicc -O2 -o "$dir/mpi_startup" scripts/mpi_startup.c
strip "$dir/rankmesh" "$dir/gpu" "$dir/mpi_startup"
venv=target/python-venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
[ -x "$venv/bin/maturin" ] || "$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2"
CARGO_TARGET_DIR=target/python "$venv/bin/maturin" build -q --release --strip --auditwheel skip --compatibility linux \
    -m python/Cargo.toml -o "$dir/wheels" >/dev/null
(cd "$dir/debs" && apt-get download -q libopenmpi3 openmpi-bin openmpi-common libpmix2 \
    libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 >/dev/null)
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/mpiroot"; done
rm -rf "$dir/debs" "$dir/mpiroot/usr/share/doc" "$dir/mpiroot/usr/share/man"
mpilib=$dir/mpiroot/usr/lib/x86_64-linux-gnu

# The closure: every library the binaries, Open MPI and its plugins load
# that neither the bundle nor the C and C++ runtimes provide. Plugins whose own needs are
# missing here (fabric and GPU transports) fail to load quietly there too,
# as they do here, and Open MPI picks another transport.
# glibc's and the compiler's runtimes are on every host, newer there: an
# older copy first on LD_LIBRARY_PATH would break the host's own programs.
system='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libatomic)\.so'
mapfile -t objects < <(printf '%s\n' "$dir/rankmesh" "$dir/gpu" "$dir/mpi_startup"; find "$dir/mpiroot" -name '*.so*' -type f)
for obj in "${objects[@]}"; do
    LD_LIBRARY_PATH=$mpilib ldd "$obj" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    [[ $name =~ $system ]] && continue
    [[ $path == "$(cd "$dir" && pwd)"* || $path == "$dir"* ]] && continue
    [[ -e $mpilib/$name ]] && continue
    cp -L "$path" "$dir/lib/$name"
done
{
    echo "rankmesh $(git rev-parse --short HEAD 2>/dev/null || echo unknown), built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "open mpi: $(dpkg-query -W -f '${Version}' libopenmpi3 2>/dev/null || echo '?') (Debian packages)"
    echo "lib/: $(ls "$dir/lib" | tr '\n' ' ')"
    echo "wheels/: $(ls "$dir/wheels" | tr '\n' ' ')"
} >"$dir/BUNDLE"
size=$(du -sm "$dir" | cut -f1)
echo "gpu-bundle: $dir, ${size} MiB"
cat "$dir/BUNDLE"
if ((size > limit_mib)); then
    echo "gpu-bundle: over ${limit_mib} MiB" >&2
    exit 1
fi
