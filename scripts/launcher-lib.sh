# Sourced by scripts/mpirun-local.sh, mpirun-bench.sh and fake-nodes.sh:
# which MPI a launcher is, and Open MPI's spelling of a job's arguments in
# hydra's.

# Sets `mpi` (openmpi | mpich | impi: RANKMESH_MPI, else asked of the
# launcher's --version once) and `ompi_4` (1 for Open MPI 4 or older,
# whose shared-memory transport is vader and whose out-of-band channel
# takes loopback alone).
launcher_kind() {
    local launcher=$1 version=""
    mpi=${RANKMESH_MPI:-}
    # The whole answer, never piped through head: under pipefail the
    # launcher's SIGPIPE (exit 141) ended the caller when head left first.
    # A hydra launcher named by RANKMESH_MPI is not asked at all.
    if [[ "$mpi" != mpich && "$mpi" != impi ]]; then
        version=$("$launcher" --version 2>&1) || true
    fi
    if [[ -z "$mpi" ]]; then
        case "$version" in
            *"Open MPI"*) mpi=openmpi ;;
            *"Intel(R) MPI"*) mpi=impi ;;
            *HYDRA* | *MPICH*) mpi=mpich ;;
            *) echo "$(basename "$0"): cannot tell which MPI $launcher is (set RANKMESH_MPI=openmpi|mpich|impi)" >&2
               exit 2 ;;
        esac
    fi
    ompi_4=0
    if [[ "$version" =~ "Open MPI) "[0-4]"." ]]; then ompi_4=1; fi
}

# Sets the array `args`: hydra passes the launcher's whole environment to
# every rank, so `-x VAR` needs nothing; `-x VAR=VALUE` is `-env VAR VALUE`,
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
