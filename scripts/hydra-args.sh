# Sourced by scripts/mpirun-local.sh and mpirun-bench.sh: Open MPI's
# spelling of a job's arguments in hydra's (MPICH, Intel MPI), into the
# array `args`. Hydra passes the launcher's whole environment to every
# rank, so `-x VAR` needs nothing; `-x VAR=VALUE` is `-env VAR VALUE`,
# local to its part of an MPMD job as Open MPI's is; `-np N` is `-n N`.
hydra_args() {
    args=()
    while (($#)); do
        case "$1" in
            -np | -n) args+=(-n "$2"); shift 2 ;;
            -x) if [[ "$2" == *=* ]]; then args+=(-env "${2%%=*}" "${2#*=}"); fi; shift 2 ;;
            *) args+=("$1"); shift ;;
        esac
    done
}
