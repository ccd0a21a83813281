#!/usr/bin/env bash
# Every test: installs missing system packages (Debian/Ubuntu), then `cargo test`
# (unit, property, doc and mpirun integration tests). Extra arguments go to cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
# Open MPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec cargo test "$@"
