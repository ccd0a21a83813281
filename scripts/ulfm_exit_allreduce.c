/* Open MPI 5.0.11 with ULFM (mpirun --with-ft ulfm): after a shrink, a
 * rank that leaves without MPI_Finalize (as survivors must there, see
 * docs/USAGE.md, "Exit") while a rank on another node is still in its
 * last MPI_Allreduce can make that MPI_Allreduce return MPI_SUCCESS with
 * its output never written. rankmesh has every survivor meet at a barrier
 * before it leaves (Runtime's drop) and agree on the step to redo after a
 * loss, so neither reaches a program; this reproduces it without rankmesh.
 *
 * Rank 1 of 4 dies; the survivors revoke, shrink, split and all-reduce 20
 * times, each checking its sum; each then _exits at once. Over two fake
 * nodes of two ranks (3 runs of 6 here print "WRONG, rc 0"):
 *   mpicc -o /tmp/ulfm_exit scripts/ulfm_exit_allreduce.c
 *   RANKMESH_MPIEXEC=.cache/mpi/openmpi5/bin/mpirun RANKMESH_FAKE_NET=1 \
 *     bash scripts/fake-nodes.sh 2 2 --with-ft ulfm /tmp/ulfm_exit
 * (mpicc and mpirun of the Open MPI 5 wheel: scripts/fetch-mpis.sh openmpi5.) */
#include <mpi.h>
#include <mpi-ext.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static void revoke_on_error(MPI_Comm *c, int *code, ...) {
    (void)code;
    MPIX_Comm_revoke(*c);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm world;
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Errhandler eh;
    MPI_Comm_create_errhandler(revoke_on_error, &eh);
    MPI_Comm_set_errhandler(world, eh);
    int rank;
    MPI_Comm_rank(world, &rank);
    double x = rank + 1.5, y = 0;
    for (int step = 0; step < 5; step++) {
        if (rank == 1 && step == 2) raise(SIGKILL);
        if (MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, world) == MPI_SUCCESS) continue;
        MPIX_Comm_revoke(world);
        MPI_Comm shrunk, group;
        MPIX_Comm_shrink(world, &shrunk);
        MPI_Comm_set_errhandler(shrunk, eh);
        int me, size;
        MPI_Comm_rank(shrunk, &me);
        MPI_Comm_size(shrunk, &size);
        MPI_Comm_split(shrunk, 0, me, &group);
        for (int k = 0; k < 20; k++) {
            double v = me + 0.25 * k, sum = -1, want = 0;
            int rc = MPI_Allreduce(&v, &sum, 1, MPI_DOUBLE, MPI_SUM, group);
            for (int r = 0; r < size; r++) want += r + 0.25 * k;
            if (sum != want)
                printf("rank %d (was %d) call %d: %s, rc %d, sum %g, want %g\n", me, rank, k,
                       rc == MPI_SUCCESS ? "WRONG" : "error", rc, sum, want);
        }
        fflush(stdout);
        break;
    }
    _exit(0); /* no MPI_Finalize after a loss */
}
