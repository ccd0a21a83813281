#!/usr/bin/env bash
# Every test: installs missing system packages (Debian/Ubuntu), then `cargo test`
# (unit, property, doc and mpirun integration tests), then the GPU check's
# rehearsal on the emulators, the hot path's counted budget, the
# portability smoke under four more MPIs, a job that loses ranks and goes on
# (ULFM, Open MPI 5) and the whole suite again under Debian's MPICH. Extra arguments go to cargo
# (and skip the rehearsal, the smoke and the MPICH suite).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --test
# NCCL's real library and headers (PyPI wheels, cached in .cache/nccl): the
# tests that need them skip without them, and fail without them under CI=true.
bash scripts/fetch-nccl.sh >/dev/null || echo "test.sh: NCCL's wheels not fetched; the real-library tests will skip" >&2
# Disk: a full run builds the suite twice (Open MPI, MPICH), rankmesh under
# four more MPIs and installs torch with its CUDA packages. Stop 76's CI ran
# out of space building the MPICH suite, with about 15 GB in use. Line tables
# keep a backtrace's file and line at a fifth of the binaries' size, and a
# one-shot run has no use for incremental state. A developer's own settings
# win.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export CARGO_PROFILE_DEV_DEBUG=${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}
# Open MPI refuses to run as root without these; harmless otherwise.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Every step's output is also kept, and at the end (pass or fail) tallied:
# tests run, failed, ignored and skipped, per binary and per pytest run, and
# each skip with its reason (tests/support's skip, python/testing/ci_skips).
mkdir -p target
log=target/test-output.log
: > "$log"
rm -f target/test-skips.log
trap 'python3 scripts/test_summary.py "$log" target/test-skips.log' EXIT
# When each step ended, from the script's start, and the disk in use and
# free after it: CI's time and space are kept well inside their limits by
# knowing which step grew.
done_at() {
    echo "test.sh: $1 done at $((SECONDS / 60)) min $((SECONDS % 60)) s;" \
        "target $(du -sh target 2>/dev/null | cut -f1), $(df -h --output=avail . | tail -1 | tr -d ' ') free" |
        tee -a "$log"
}
cargo test "$@" 2>&1 | tee -a "$log"
done_at "cargo test"
# The GPU check rehearsed end to end on the emulators, from a bundle built as
# for a GPU machine (issue #46), and rankmesh built against Debian's MPICH
# and the PyPI wheels of Open MPI 5, MPICH 5 and Intel MPI, each run under
# its own launcher, then the whole suite built against Debian's MPICH
# (issue #49); a run narrowed by arguments skips them.
if (($# == 0)); then
    # The Python package (issue #50): pytest under mpirun at np 1-4.
    bash scripts/python-test.sh 2>&1 | tee -a "$log"
    done_at "the Python package"
    bash scripts/gpu-rehearse.sh
    done_at "the GPU check's rehearsal"
    # The hot path's per-call instructions and system calls against their
    # budgets (issue #65): CI cannot time a call, but it can count.
    bash scripts/hot-path-guard.sh 2>&1 | tee -a "$log"
    done_at "the hot path's budget"
    # Each smoke's build is of no use once it passed.
    for mpi in mpich openmpi5 mpich5 impi; do
        bash scripts/mpi-smoke.sh "$mpi"
        # A lost rank survived (issue #66): ULFM is Open MPI 5's, and the
        # trials reuse its smoke's build.
        if [[ "$mpi" == openmpi5 ]]; then bash scripts/ulfm-test.sh; fi
        rm -rf "target/mpi-$mpi" target/python-ompi5 target/python-ompi5-site target/emulators-openmpi5
    done
    done_at "the smokes under four more MPIs, and a lost rank survived"
    bash scripts/mpich-suite.sh
    done_at "the suite under MPICH"
fi
