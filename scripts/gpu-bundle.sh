#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a CUDA host that has no Rust
# toolchain and no MPI (such as a lent GPU machine): the release `rankmesh`,
# the device test binary `gpu`, and Open MPI's runtime unpacked from Debian's
# packages into mpiroot/ (about 20 MB in all).
#
#   bash scripts/gpu-bundle.sh .gpu-bundle
#   # on the CUDA host, from the repository root:
#   RANKMESH_PREBUILT=.gpu-bundle bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu-bundle}
cargo build --release --bin rankmesh --test gpu
rm -rf "$dir"
mkdir -p "$dir/debs"
cp target/release/rankmesh "$dir/"
cp "$(ls -t target/release/deps/gpu-* | grep -v '\.d$' | head -n1)" "$dir/gpu"
(cd "$dir/debs" && apt-get download -q libopenmpi3 openmpi-bin openmpi-common libpmix2 \
    libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7)
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$dir/mpiroot"; done
rm -rf "$dir/debs" "$dir/mpiroot/usr/share/doc" "$dir/mpiroot/usr/share/man"
du -sh "$dir"
