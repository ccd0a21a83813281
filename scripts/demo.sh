#!/usr/bin/env bash
# The main job on this machine: installs missing system packages (Debian/Ubuntu),
# builds rankmesh, and runs `rankmesh topo` on 4 local MPI ranks (CPU only).
# Extra arguments go to `rankmesh topo`, e.g. `scripts/demo.sh --tp 4 --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release --quiet --bin rankmesh
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--tp 2 --sp 2)
exec bash scripts/mpirun-local.sh -np "${RANKMESH_DEMO_RANKS:-4}" target/release/rankmesh topo "${args[@]}"
