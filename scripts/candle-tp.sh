#!/usr/bin/env bash
# Builds the candle tensor-parallel MLP example (examples/candle-tp) and runs
# it on NP local ranks (default 2; more arguments go to the example: batch
# hidden ffn). Rank 0 prints the largest difference from the single-process
# block; the run fails when it is above the f32 tolerance.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
shift $(( $# < 1 ? $# : 1 ))
cargo build --release -p candle-tp
scripts/mpirun-local.sh -np "$np" "${CARGO_TARGET_DIR:-target}/release/candle-tp" "$@"
