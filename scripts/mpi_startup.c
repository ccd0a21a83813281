/* The raw-MPI baseline of scripts/gpu-check.sh's start-up row: what
 * `rankmesh topo` needs from MPI at the least (MPI_Init, the node split
 * that replaces a shared-memory probe, a split into groups, a barrier),
 * with nothing of rankmesh. The row times the whole launch of each. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm node, pairs;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &pairs);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_startup: %d ranks\n", size);
    MPI_Comm_free(&pairs);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
}
